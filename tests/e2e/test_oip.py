"""End to end: Triton's own HTTP client (`tritonclient.http`) against the real API and worker,
over the Open Inference Protocol: health, server and model metadata, readiness, config, and
infer with binary and JSON tensors (several datatypes, strings), answered with the models' own
outputs by TensorFlow; each infer a job of its own, and a bad request refused before one is
stored. On the fleet the read-only modules share (tests/e2e/conftest.py), with a tenant of its
own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import SharedFleet
from tests.formats import VOCABULARY

pytestmark = pytest.mark.slow

MODELS = ("mixed", "text")  # of the shared fleet's models, the ones this test uses


def assert_same(got: np.ndarray | None, want: Any) -> None:
    want = np.asarray(want)
    assert got is not None
    assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def tensor(name: str, array: np.ndarray, datatype: str, *, binary: bool = True) -> Any:
    given = triton.InferInput(name, list(array.shape), datatype)
    given.set_data_from_numpy(array, binary_data=binary)
    return given


def test_tritonclient_infers_on_the_real_worker_with_binary_and_json_tensors(
    shared_fleet: SharedFleet,
) -> None:
    import tensorflow as tf  # here, not at collection: `make test-fast` never starts TensorFlow

    fleet, mixed, text = shared_fleet.fleet, shared_fleet.built["mixed"], shared_fleet.built["text"]
    client = triton.InferenceServerClient(url=f"127.0.0.1:{fleet.api_port}", network_timeout=60)
    # A tenant of its own: the jobs it lists are the ones this test made.
    headers = shared_fleet.key("oip")

    def key() -> dict[str, str]:
        # A new dict each call: tritonclient's infer() writes Inference-Header-Content-Length
        # into the one it is given, which a later JSON-only request would then carry.
        return dict(headers)

    # Health and the server's metadata need no key; everything about a model takes one.
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert server["name"] == "tffleet"
    assert "binary_tensor_data" in server["extensions"]
    assert client.is_model_ready("mixed", headers=key())
    assert client.is_model_ready("text", "1", headers=key())
    with pytest.raises(InferenceServerException) as unauthorized:
        client.get_model_metadata("mixed")
    assert unauthorized.value.status() == "401"

    metadata = client.get_model_metadata("mixed", headers=key())
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "tensorflow_savedmodel"
    assert metadata["inputs"] == [
        {"name": "flag", "datatype": "BOOL", "shape": [-1]},
        {"name": "k", "datatype": "INT64", "shape": [-1]},
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
    ]
    assert {(t["name"], t["datatype"], tuple(t["shape"])) for t in metadata["outputs"]} == {
        ("y", "FP32", (-1, 2)),
        ("k2", "INT64", (-1,)),
        ("negative", "BOOL", (-1,)),
        ("kept", "FP32", (-1,)),
    }
    config = client.get_model_config("mixed", headers=key())
    assert config["max_batch_size"] == 8
    assert {"name": "x", "data_type": "TYPE_FP32", "dims": [3]} in config["input"]
    text_config = client.get_model_config("text", headers=key())
    assert text_config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": []}]
    index = client.get_model_repository_index(headers=key())
    assert {(m["name"], m["version"], m["state"]) for m in index if m["name"] in MODELS} == {
        ("mixed", "1", "READY"),
        ("text", "1", "READY"),
    }

    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 3)).astype(np.float32)
    k = np.array([1, -2, 2**40], dtype=np.int64)
    flag = np.array([True, False, True])
    want = {
        name: value.numpy()
        for name, value in mixed.predict(
            x=tf.constant(x), k=tf.constant(k), flag=tf.constant(flag)
        ).items()
    }

    # Binary inputs and outputs: what tritonclient sends and asks for by default.
    binary = client.infer(
        "mixed",
        [tensor("x", x, "FP32"), tensor("k", k, "INT64"), tensor("flag", flag, "BOOL")],
        request_id="r1",
        headers=key(),
    )
    for name in ("y", "k2", "negative", "kept"):
        assert_same(binary.as_numpy(name), want[name])
    response = binary.get_response()
    assert response["id"] == "r1" and response["model_version"] == "1"

    # JSON inputs, and outputs asked for by name: two in JSON, one binary, one left out.
    json = client.infer(
        "mixed",
        [
            tensor("x", x, "FP32", binary=False),
            tensor("k", k, "INT64", binary=False),
            tensor("flag", flag, "BOOL", binary=False),
        ],
        model_version="1",
        outputs=[
            triton.InferRequestedOutput("y", binary_data=False),
            triton.InferRequestedOutput("k2", binary_data=False),
            triton.InferRequestedOutput("negative"),
        ],
        headers=key(),
    )
    outputs = {t["name"]: t for t in json.get_response()["outputs"]}
    assert sorted(outputs) == ["k2", "negative", "y"]
    assert "data" in outputs["y"] and "data" in outputs["k2"] and "data" not in outputs["negative"]
    for name in ("y", "k2", "negative"):
        assert_same(json.as_numpy(name), want[name])
    assert json.as_numpy("kept") is None

    # Strings (BYTES), binary: lengths-prefixed elements both ways, "é" is 2 bytes of UTF-8
    # and its `head` is 1 byte that is not UTF-8, which only binary data can carry.
    words = np.array([b"two", "é".encode(), b"", b"three"], dtype=np.object_)
    served = text.serve(text=tf.constant(words))
    strings = client.infer("text", [tensor("text", words, "BYTES")], headers=key())
    assert_same(strings.as_numpy("chars"), served["chars"].numpy())
    assert_same(strings.as_numpy("id"), np.array([VOCABULARY.index("two"), -1, -1, 3]))
    assert list(strings.as_numpy("upper")) == [b"TWO", "é".encode(), b"", b"THREE"]
    assert list(strings.as_numpy("head")) == list(served["head"].numpy())
    strings_json = client.infer(
        "text",
        [tensor("text", words[[0, 3]], "BYTES", binary=False)],
        outputs=[triton.InferRequestedOutput("upper", binary_data=False)],
        timeout=60_000_000,  # microseconds: the job's deadline (Cancel-After)
        headers=key(),
    )
    assert list(strings_json.as_numpy("upper")) == ["TWO", "THREE"]

    # Each infer is a job of the caller's tenant, pollable as any other.
    job_ids = [
        result.get_response()["parameters"]["tffleet_job_id"]
        for result in (binary, json, strings, strings_json)
    ]
    assert len(set(job_ids)) == 4
    with fleet.http(timeout=30, headers=headers) as http:
        for job_id in job_ids:
            job = http.get(f"/v1/jobs/{job_id}").json()
            assert job["status"] == "succeeded", job
        assert job["model"] == "text" and job["deadline_at"] is not None
        assert all(
            http.get(f"/v1/jobs/{job_id}").json()["deadline_at"] is None for job_id in job_ids[:3]
        )
        stored = len(http.get("/v1/jobs", params={"limit": 500}).json()["jobs"])
        assert stored == 4

        # A datatype the signature does not take: 400 naming the input, and no job stored.
        with pytest.raises(InferenceServerException) as wrong:
            client.infer("mixed", [tensor("x", x.astype(np.float64), "FP64")], headers=key())
        assert wrong.value.status() == "400"
        assert "input 'x' is FP32, got FP64" in wrong.value.message()
        # An input the model does not have, in JSON: the same.
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("mixed", [tensor("z", x, "FP32", binary=False)], headers=key())
        assert unknown.value.status() == "400"
        assert "no input 'z'" in unknown.value.message()
        assert len(http.get("/v1/jobs", params={"limit": 500}).json()["jobs"]) == stored
    client.close()
