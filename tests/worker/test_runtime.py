"""The real TensorFlow path: a tiny Keras model exported as a SavedModel, loaded and run."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import JobStatus
from tffleet import tensors
from tffleet.devices import Device, pin_environment
from tffleet.objectstore import files, open_store
from worker.batching import Batcher, BatchPolicy
from worker.repository import ModelConfig, ModelSpec

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytestmark = pytest.mark.slow

keras: Any = None
runtime: Any = None


@pytest.fixture(scope="module", autouse=True)
def _tensorflow() -> None:
    """TensorFlow, imported once the first test here runs: collecting never starts it."""
    global keras, runtime
    keras = pytest.importorskip("keras")
    runtime = pytest.importorskip("worker.runtime")  # imports TensorFlow


@dataclass(frozen=True)
class Exported:
    model: Any  # the Keras model, to compare against
    path: Path


def export(path: Path, build: Any) -> Exported:
    keras.utils.set_random_seed(0)
    model = build()
    model.export(str(path), format="tf_saved_model", verbose=False)
    return Exported(model=model, path=path)


def mlp() -> Any:
    inputs = keras.Input(shape=(4,), name="x")
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def two_inputs() -> Any:
    a = keras.Input(shape=(3,), name="a", dtype="float32")
    b = keras.Input(shape=(2,), name="b", dtype="float32")
    joined = keras.layers.Concatenate()([a, b])
    return keras.Model([a, b], keras.layers.Dense(2)(joined))


@pytest.fixture(scope="module")
def mlp_model(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return export(tmp_path_factory.mktemp("repo") / "mlp" / "1", mlp)


@pytest.fixture(scope="module")
def two_input_model(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return export(tmp_path_factory.mktemp("repo") / "pair" / "1", two_inputs)


def spec_for(exported: Exported, **config: Any) -> ModelSpec:
    return ModelSpec(
        name=exported.path.parent.name,
        version=1,
        path=exported.path,
        format="saved_model",
        config=ModelConfig(**config),
    )


def sample(n: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


def test_load_records_the_signature_with_minus_one_for_the_batch(mlp_model: Exported) -> None:
    loaded = runtime.load(spec_for(mlp_model))

    assert loaded.format == "saved_model"
    assert loaded.inputs == {"x": {"dtype": "float32", "shape": [-1, 4]}}
    assert loaded.outputs == {"output_0": {"dtype": "float32", "shape": [-1, 3]}}


def test_run_equals_calling_the_keras_model(mlp_model: Exported) -> None:
    loaded = runtime.load(spec_for(mlp_model))
    x = sample(5, 4, seed=1)

    out = loaded.run({"x": x})

    assert list(out) == ["output_0"]
    assert isinstance(out["output_0"], np.ndarray)
    np.testing.assert_allclose(out["output_0"], np.asarray(mlp_model.model(x)), rtol=1e-5)


def test_an_input_mapped_from_a_directory_store_reaches_tensorflow_without_a_copy(
    tmp_path: Path, mlp_model: Exported
) -> None:
    from worker.runtime.feed import as_tensor

    store = open_store((tmp_path / "objects").as_uri())
    x = sample(files.MAP_MIN_BYTES // 16 + 1, 4, seed=3)  # over MAP_MIN_BYTES: mapped
    data, ref = tensors.npy_object("t/jobs/j/inputs/x.npy", x)
    store.put(ref.key, data)
    whole = store.get(ref.key)
    mapped = tensors.unpack(tensors.pack({}, {"x": ref}), {ref.key: whole})["x"]
    loaded = runtime.load(spec_for(mlp_model))
    expected = np.asarray(mlp_model.model(x))
    np.testing.assert_allclose(loaded.run({"x": mapped})["output_0"], expected, rtol=1e-5)

    viewed = as_tensor(mapped, "float32")
    np.frombuffer(whole, dtype=np.float32, offset=ref.offset)[:4] = 7  # the map's private copy
    assert viewed.numpy()[0].tolist() == [7.0] * 4  # the tensor is that memory, not a copy
    assert not mapped.flags.writeable  # still read-only to the code that reads the inputs
    inline = tensors.unpack(tensors.pack({"x": x}))["x"]  # read-only bytes: copied, as before
    np.testing.assert_array_equal(as_tensor(inline, "float32").numpy(), x)
    strings = np.array([b"0123456789"] * 20_000, dtype=object)  # 160 KB of pointers: copied
    assert as_tensor(strings, "string").dtype.name == "string"


def test_warm_up_runs_every_bucket_size(mlp_model: Exported) -> None:
    loaded = runtime.load(spec_for(mlp_model))
    seen: list[int] = []
    run = loaded.run

    def recording(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(len(batch["x"]))
        return run(batch)

    loaded.run = recording

    seconds = loaded.warm_up((1, 2, 4, 8))

    assert seen == [1, 2, 4, 8]
    assert seconds > 0


def test_a_missing_signature_is_a_clear_error_naming_the_ones_there(mlp_model: Exported) -> None:
    with pytest.raises(ValueError) as raised:
        runtime.load(spec_for(mlp_model, signature="predict"))

    message = str(raised.value)
    assert str(mlp_model.path) in message
    assert "no signature 'predict'" in message
    assert "serving_default" in message


def test_a_directory_of_another_format_than_configured_is_a_clear_error(
    mlp_model: Exported,
) -> None:
    spec = ModelSpec(name="mlp", version=1, path=mlp_model.path, format="keras")

    with pytest.raises(ValueError, match=f"{mlp_model.path}: expected one .keras file, found none"):
        runtime.load(spec)


def test_a_model_with_several_inputs_runs_them_by_name(two_input_model: Exported) -> None:
    loaded = runtime.load(spec_for(two_input_model))
    a, b = sample(3, 3, seed=2), sample(3, 2, seed=3)

    out = loaded.run({"b": b, "a": a})

    assert loaded.inputs == {
        "a": {"dtype": "float32", "shape": [-1, 3]},
        "b": {"dtype": "float32", "shape": [-1, 2]},
    }
    (name,) = loaded.outputs
    np.testing.assert_allclose(out[name], np.asarray(two_input_model.model([a, b])), rtol=1e-5)


# through the batcher, with the database


def submit(sessions: sessionmaker[Session], arrays: dict[str, np.ndarray], model: str) -> str:
    (samples,) = {len(v) for v in arrays.values()}
    new = jobs.NewJob(model=model, version=1, samples=samples, inputs=tensors.pack(arrays))
    with sessions.begin() as session:
        return jobs.create(session=session, jobs=[new])[0].id


def outputs_of(sessions: sessionmaker[Session], job_id: str) -> dict[str, np.ndarray]:
    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        assert job.status == JobStatus.SUCCEEDED, job.error_message
        assert job.outputs is not None
        return tensors.unpack(job.outputs)


def run_batch(
    sessions: sessionmaker[Session], *, model: str, job_ids: list[str], loaded: Any
) -> None:
    config: ModelConfig = loaded.spec.config
    policy = BatchPolicy(
        max_batch_size=config.max_batch_size,
        max_queue_delay_ms=0,
        buckets=config.bucket_sizes(),
    )
    batcher = Batcher(sessions=sessions, owner="t1", lease_s=30, notify=lambda _: None)
    report = batcher.run(model=model, version=1, job_ids=job_ids, runner=loaded, policy=policy)
    assert report.succeeded == len(job_ids)


def test_batching_with_the_real_runtime_gives_each_job_the_models_outputs(
    sessions: sessionmaker[Session], mlp_model: Exported
) -> None:
    loaded = runtime.load(spec_for(mlp_model, max_batch_size=4))
    xs = [sample(n, 4, seed=n) for n in (1, 2, 6)]  # 9 samples: chunks of 4, 4 and 1
    ids = [submit(sessions, {"x": x}, "mlp") for x in xs]

    run_batch(sessions, model="mlp", job_ids=ids, loaded=loaded)

    for job_id, x in zip(ids, xs, strict=True):
        out = outputs_of(sessions, job_id)["output_0"]
        assert out.shape == (len(x), 3)
        np.testing.assert_allclose(out, np.asarray(mlp_model.model(x)), rtol=1e-5)


def test_batching_keeps_several_inputs_of_each_job_together(
    sessions: sessionmaker[Session], two_input_model: Exported
) -> None:
    loaded = runtime.load(spec_for(two_input_model, max_batch_size=8))
    pairs = [(sample(n, 3, seed=n), sample(n, 2, seed=10 + n)) for n in (2, 3)]
    ids = [submit(sessions, {"a": a, "b": b}, "pair") for a, b in pairs]
    (name,) = loaded.outputs

    run_batch(sessions, model="pair", job_ids=ids, loaded=loaded)

    for job_id, (a, b) in zip(ids, pairs, strict=True):
        expected = np.asarray(two_input_model.model([a, b]))
        np.testing.assert_allclose(outputs_of(sessions, job_id)[name], expected, rtol=1e-5)


def _without_tensorflow_device_settings() -> dict[str, str]:
    """This process's environment, less what would pick TensorFlow's devices for it."""
    chosen = ("CUDA_VISIBLE_DEVICES", "TF_ENABLED_DEVICE_TYPES")
    return {k: v for k, v in os.environ.items() if k not in chosen}


def test_a_cpu_child_runs_tensorflow_without_probing_cuda() -> None:
    """No `failed call to cuInit` error where no NVIDIA driver is installed: TensorFlow never
    touches CUDA in a child pinned to a CPU slot, whatever the host has."""
    env = {
        **_without_tensorflow_device_settings(),
        **pin_environment(Device("cpu", 0), cpu_threads=1),
    }
    code = (
        "from worker import runtime; import tensorflow as tf; "
        "print([d.device_type for d in tf.config.list_physical_devices()], int(tf.constant(1) + 1))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["['CPU']", "2"]
    assert "cuInit" not in ran.stderr


def test_the_example_model_is_built_without_probing_cuda(tmp_path: Path) -> None:
    """What `tffleet up` runs first on an empty repository."""
    ran = subprocess.run(
        [sys.executable, "-m", "worker.example", str(tmp_path)],
        env=_without_tensorflow_device_settings(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "example" / "1" / "saved_model.pb").exists()
    assert "cuInit" not in ran.stderr
