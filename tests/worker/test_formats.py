"""Every format behind one runtime interface, with real TensorFlow: SavedModel signatures of mixed
dtypes and strings, Keras .keras files, TF1 frozen graphs; warm-up, close, and load errors."""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from db.jobs import Lease
from tests.e2e.models import build_free_matmul
from tests.formats import (
    VOCABULARY,
    build_frozen_graph,
    build_keras_file,
    build_mixed,
    build_text,
    write_corrupt,
)
from tffleet import tensors
from worker.pipeline import BatchPolicy, run_leases
from worker.repository import ModelConfig, ModelSpec, scan

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytestmark = pytest.mark.slow

tf: Any = None
runtime: Any = None


@pytest.fixture(scope="module", autouse=True)
def _tensorflow() -> None:
    """TensorFlow, imported once the first test here runs: collecting never starts it."""
    global tf, runtime
    tf = pytest.importorskip("tensorflow")
    runtime = pytest.importorskip("worker.runtime")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("repo")


@pytest.fixture(scope="module")
def mixed(repo: Path) -> Any:
    return build_mixed(repo)


@pytest.fixture(scope="module")
def text(repo: Path) -> Any:
    return build_text(repo)


@pytest.fixture(scope="module")
def kfile(repo: Path) -> Any:
    return build_keras_file(repo)


@pytest.fixture(scope="module")
def frozen(repo: Path) -> Any:
    return build_frozen_graph(repo)


def spec_of(repository: Path, name: str, **config: Any) -> ModelSpec:
    """The model's spec as the worker reads it (format detected, model.toml applied); `config`
    given replaces model.toml's."""
    (spec,) = [s for s in scan(repository) if s.name == name]
    if config:
        spec = ModelSpec(spec.name, spec.version, spec.path, spec.format, ModelConfig(**config))
    return spec


def strings(*items: str | bytes) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = [i.encode() if isinstance(i, str) else i for i in items]
    return array


def recording(loaded: Any) -> list[dict[str, np.ndarray]]:
    """The batches `loaded.run` is given from now on."""
    seen: list[dict[str, np.ndarray]] = []
    run = loaded.run

    def record(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(batch)
        return run(batch)

    loaded.run = record
    return seen


# SavedModel


def test_a_saved_model_signature_of_mixed_dtypes_runs_as_in_tensorflow(
    repo: Path, mixed: Any
) -> None:
    loaded = runtime.load(spec_of(repo, "mixed"))
    x = np.array([[1, -2, 3], [0.5, 0, 1]], dtype=np.float32)
    k = np.array([3, -4], dtype=np.int64)
    flag = np.array([True, False])

    out = loaded.run({"x": x, "k": k, "flag": flag})

    assert loaded.format == "saved_model"
    assert loaded.inputs == {
        "flag": {"dtype": "bool", "shape": [-1]},
        "k": {"dtype": "int64", "shape": [-1]},
        "x": {"dtype": "float32", "shape": [-1, 3]},
    }
    assert {name: s["dtype"] for name, s in loaded.outputs.items()} == {
        "k2": "int64",
        "kept": "float32",
        "negative": "bool",
        "y": "float32",
    }
    expected = mixed.predict(x=x, k=k, flag=flag)
    assert sorted(out) == sorted(expected)
    for name, value in expected.items():
        assert out[name].dtype == value.numpy().dtype
        np.testing.assert_array_equal(out[name], value.numpy())
    assert loaded.warm_up((1, 2, 8)) > 0  # zeros and False


def test_a_string_saved_model_takes_and_gives_object_arrays_of_bytes(repo: Path, text: Any) -> None:
    loaded = runtime.load(spec_of(repo, "text"))
    words = strings("two", "é", "", "nope")

    out = loaded.run({"text": words})

    assert loaded.inputs == {"text": {"dtype": "string", "shape": [-1]}}
    assert loaded.outputs["upper"] == loaded.outputs["head"] == {"dtype": "string", "shape": [-1]}
    expected = text.serve(text=words)
    for name, value in expected.items():
        np.testing.assert_array_equal(out[name], value.numpy())
    assert out["id"].tolist() == [VOCABULARY.index("two"), -1, -1, -1]
    assert out["upper"].dtype == object and out["head"].tolist() == [b"t", b"\xc3", b"", b"n"]
    assert loaded.warm_up((1, 4)) > 0  # empty strings


def test_a_string_model_pads_a_batch_with_empty_strings_and_splits_it_back(
    repo: Path, text: Any
) -> None:
    loaded = runtime.load(spec_of(repo, "text"))
    seen = recording(loaded)
    jobs = [strings("one"), strings("three", "été")]
    leases = [
        Lease(f"job{i}", "t", 1, len(words), 0, tensors.pack({"text": words}))
        for i, words in enumerate(jobs)
    ]
    policy = BatchPolicy(max_batch_size=8, max_queue_delay_ms=0, buckets=(1, 4, 8))

    outcomes = dict(run_leases(leases, runner=loaded, policy=policy))

    (batch,) = seen
    assert batch["text"].tolist() == [b"one", b"three", "été".encode(), b""]
    for held, words in zip(leases, jobs, strict=True):
        out = tensors.unpack(outcomes[held])
        assert out["upper"].tolist() == text.serve(text=words)["upper"].numpy().tolist()


def test_a_signature_tffleet_cannot_carry_is_refused_at_load(tmp_path: Path) -> None:
    class Odd(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 2], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            return {"z": tf.complex(x, x)}

    module = Odd()
    tf.saved_model.save(module, str(tmp_path / "odd" / "1"), signatures=module.serve)

    with pytest.raises(ValueError, match="output 'z' has dtype complex64, which tffleet cannot"):
        runtime.load(spec_of(tmp_path, "odd"))


def test_a_fixed_batch_size_needs_buckets_of_that_size(tmp_path: Path) -> None:
    class Fixed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 2], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": x * 2}

    module = Fixed()
    tf.saved_model.save(module, str(tmp_path / "fixed" / "1"), signatures=module.serve)

    with pytest.raises(ValueError, match=r"fixed batch size of 1; set max_batch_size = 1 and"):
        runtime.load(spec_of(tmp_path, "fixed"))
    loaded = runtime.load(spec_of(tmp_path, "fixed", max_batch_size=1))
    assert loaded.run({"x": np.ones((1, 2), np.float32)})["y"].tolist() == [[2, 2]]


# Keras


def test_a_keras_file_takes_its_dict_inputs_and_names_outputs_by_their_layers(
    repo: Path, kfile: Any
) -> None:
    loaded = runtime.load(spec_of(repo, "kfile"))
    a = np.random.default_rng(0).standard_normal((3, 3)).astype(np.float32)
    b = np.array([[1, 2], [0, -1], [5, 5]], dtype=np.int32)

    out = loaded.run({"a": a, "b": b})

    assert loaded.format == "keras"
    assert loaded.inputs == {
        "a": {"dtype": "float32", "shape": [-1, 3]},
        "b": {"dtype": "int32", "shape": [-1, 2]},
    }
    assert loaded.outputs == {
        "probability": {"dtype": "float32", "shape": [-1, 1]},
        "scores": {"dtype": "float32", "shape": [-1, 2]},
    }
    scores, probability = kfile({"a": a, "b": b})
    np.testing.assert_allclose(out["scores"], np.asarray(scores), rtol=1e-6)
    np.testing.assert_allclose(out["probability"], np.asarray(probability), rtol=1e-6)


def test_a_single_output_keras_model_names_it_output_0(tmp_path: Path) -> None:
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(2)])
    (tmp_path / "seq" / "1").mkdir(parents=True)
    model.save(tmp_path / "seq" / "1" / "seq.keras")
    loaded = runtime.load(spec_of(tmp_path, "seq"))
    x = np.ones((2, 4), np.float32)

    out = loaded.run({"x": x})

    assert loaded.inputs == {"x": {"dtype": "float32", "shape": [-1, 4]}}
    assert list(out) == list(loaded.outputs) == ["output_0"]
    np.testing.assert_allclose(out["output_0"], np.asarray(model(x)), rtol=1e-6)


# frozen graphs


def test_a_frozen_graph_runs_the_tensors_model_toml_names(repo: Path, frozen: Any) -> None:
    loaded = runtime.load(spec_of(repo, "frozen"))
    image = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    words = strings("a", "été", "")

    out = loaded.run({"image": image, "words": words})

    assert loaded.format == "frozen_graph"
    assert loaded.inputs == {
        "image": {"dtype": "float32", "shape": [-1, 4]},
        "words": {"dtype": "string", "shape": [-1]},
    }
    assert loaded.outputs == {
        "lengths": {"dtype": "int32", "shape": [-1]},
        "probabilities": {"dtype": "float32", "shape": [-1, 3]},
    }
    probabilities, lengths = frozen(image, words)
    np.testing.assert_allclose(out["probabilities"], probabilities.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(out["lengths"], [1, 5, 0])
    np.testing.assert_array_equal(out["lengths"], lengths.numpy())


def test_a_frozen_graph_session_uses_the_childs_thread_settings(
    repo: Path, frozen: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs: list[Any] = []
    session = tf.compat.v1.Session

    def recording_session(*, graph: Any, config: Any) -> Any:
        configs.append(config)
        return session(graph=graph, config=config)

    monkeypatch.setattr(tf.compat.v1, "Session", recording_session)

    runtime.load(spec_of(repo, "frozen"))

    (config,) = configs
    threads = tf.config.threading
    assert config.intra_op_parallelism_threads == threads.get_intra_op_parallelism_threads()
    assert config.inter_op_parallelism_threads == threads.get_inter_op_parallelism_threads()


def copy_graph(repo: Path, tmp_path: Path, toml: str | None) -> ModelSpec:
    (tmp_path / "graph" / "1").mkdir(parents=True)
    graph = (repo / "frozen" / "1" / "model.pb").read_bytes()
    (tmp_path / "graph" / "1" / "model.pb").write_bytes(graph)
    if toml is not None:
        (tmp_path / "graph" / "model.toml").write_text(toml)
    return spec_of(tmp_path, "graph")


def test_a_frozen_graph_without_tensor_names_lists_its_placeholders_and_likely_outputs(
    repo: Path, frozen: Any, tmp_path: Path
) -> None:
    spec = copy_graph(repo, tmp_path, toml=None)

    with pytest.raises(ValueError) as raised:
        runtime.load(spec)

    message = str(raised.value)
    assert message.startswith(f"{spec.path / 'model.pb'}: a frozen graph needs its tensors named")
    assert "[inputs] and [outputs]" in message
    assert "its placeholders: image:0 (float32, (None, 4)), words:0 (string, (None,));" in message
    assert "likely outputs: Identity:0 (float32, (None, 3)), Identity_1:0 (int32" in message


def test_a_frozen_graph_tensor_that_is_not_there_is_named(
    repo: Path, frozen: Any, tmp_path: Path
) -> None:
    spec = copy_graph(
        repo, tmp_path, '[inputs]\nimage = "image:0"\n[outputs]\nprobs = "softmax:0"\n'
    )

    with pytest.raises(ValueError) as raised:
        runtime.load(spec)

    message = str(raised.value)
    assert "[outputs] probs = 'softmax:0': The name 'softmax:0' refers to a Tensor which" in message
    assert "its placeholders: image:0" in message


def test_a_frozen_graph_pinned_to_a_device_this_child_lacks_runs_where_it_can(
    repo: Path, frozen: Any, tmp_path: Path
) -> None:
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString((repo / "frozen" / "1" / "model.pb").read_bytes())
    for node in graph_def.node:
        node.device = "/device:GPU:7"
    (tmp_path / "pinned" / "1").mkdir(parents=True)
    (tmp_path / "pinned" / "1" / "model.pb").write_bytes(graph_def.SerializeToString())
    (tmp_path / "pinned" / "model.toml").write_text((repo / "frozen" / "model.toml").read_text())
    loaded = runtime.load(spec_of(tmp_path, "pinned"))

    out = loaded.run({"image": np.ones((1, 4), np.float32), "words": strings("abc")})

    assert out["lengths"].tolist() == [3]


# every format


@pytest.mark.parametrize("name", ["mixed", "text", "kfile", "frozen"])
def test_close_releases_the_model_and_running_it_then_says_so(
    repo: Path, name: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue(name)
    loaded = runtime.load(spec_of(repo, name))

    loaded.close()
    loaded.close()

    with pytest.raises(RuntimeError, match="the model was closed"):
        loaded.warm_up((1,))


def write_keras_zip_of_junk(path: Path) -> None:
    with zipfile.ZipFile(path / "model.keras", "w") as archive:
        archive.writestr("config.json", "{not json")


@pytest.mark.parametrize(
    ("write", "problem"),
    [
        (lambda p: (p / "saved_model.pb").write_bytes(b"\x00junk"), "not a loadable SavedModel"),
        (
            lambda p: (p / "model.keras").write_bytes(b"junk"),
            r"not a \.keras file \(a \.keras file is a zip archive\)",
        ),
        (write_keras_zip_of_junk, "not a loadable Keras model"),
        (lambda p: (p / "model.pb").write_bytes(b"\x0ajunk"), "not a loadable frozen GraphDef"),
    ],
    ids=["saved_model", "keras_not_zip", "keras_bad_zip", "frozen_graph"],
)
def test_a_corrupt_model_is_a_clear_error_naming_its_path(
    tmp_path: Path, write: Any, problem: str
) -> None:
    path = tmp_path / "bad" / "1"
    path.mkdir(parents=True)
    write(path)
    (tmp_path / "bad" / "model.toml").write_text('[inputs]\nx = "x:0"\n[outputs]\ny = "y:0"\n')

    with pytest.raises(ValueError, match=problem) as raised:
        runtime.load(spec_of(tmp_path, "bad"))

    assert str(raised.value).startswith(str(path))


def test_a_corrupt_saved_model_names_the_parse_error(tmp_path: Path) -> None:
    path = write_corrupt(tmp_path)

    with pytest.raises(ValueError, match="Error parsing message") as raised:
        runtime.load(spec_of(tmp_path, "broken"))

    assert str(path) in str(raised.value)


# warm-up


def test_warm_up_repeats_or_cuts_the_warmup_files_samples_to_each_bucket(
    repo: Path, text: Any
) -> None:
    spec = spec_of(repo, "text")
    np.savez(spec.path / "warmup.npz", text=np.array(["one", "two", "été"]))
    loaded = runtime.load(spec_of(repo, "text", warmup="warmup.npz", max_batch_size=4))
    seen = recording(loaded)

    loaded.warm_up((1, 2, 4))

    assert [batch["text"].tolist() for batch in seen] == [
        [b"one"],
        [b"one", b"two"],
        [b"one", b"two", "été".encode(), b"one"],
    ]


def test_a_free_dimension_warms_up_only_with_a_warmup_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.runtime")
    build_free_matmul(tmp_path)
    loaded = runtime.load(spec_of(tmp_path, "matmul"))
    seen = recording(loaded)

    assert loaded.warm_up((1, 2)) == 0.0
    assert seen == []
    assert "have free dimensions and no warmup file is configured; no warm-up" in caplog.text

    np.savez(tmp_path / "matmul" / "1" / "w.npz", x=np.ones((3, 4)))  # float64: cast
    loaded = runtime.load(spec_of(tmp_path, "matmul", warmup="w.npz"))
    seen = recording(loaded)
    loaded.warm_up((1, 2))
    assert [b["x"].shape for b in seen] == [(1, 4), (2, 4)]
    assert {b["x"].dtype for b in seen} == {np.dtype(np.float32)}


@pytest.mark.parametrize(
    ("arrays", "problem"),
    [
        (
            {"words": np.array(["a"])},
            r"holds arrays \['words'\]; it needs one per input, \['text'\]",
        ),
        ({"text": np.array([1, 2])}, "array 'text' is not string"),
        ({"text": np.array([], dtype=str)}, "array 'text' needs at least one sample"),
    ],
)
def test_a_warmup_file_that_does_not_fit_is_a_clear_error(
    repo: Path, text: Any, tmp_path: Path, arrays: dict[str, np.ndarray], problem: str
) -> None:
    spec = spec_of(repo, "text")
    np.savez(spec.path / "bad_warmup.npz", **arrays)
    loaded = runtime.load(spec_of(repo, "text", warmup="bad_warmup.npz"))

    with pytest.raises(ValueError, match=problem) as raised:
        loaded.warm_up((1,))

    assert str(raised.value).startswith(str(spec.path / "bad_warmup.npz"))
