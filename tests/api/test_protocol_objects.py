"""The protocol facades (TF Serving REST, the Open Inference Protocol) keep big tensors out of
SQL as the job API does: an input over TFFLEET_INLINE_MAX_BYTES goes to the object store under
its job, and an input may name an upload (TF Serving's columnar `inputs`, OIP's
`parameters.tffleet_uri`), checked as a `{"uri"}` of the job API is. On the real app, database,
Redis and store (a directory, and a real S3 server), with a fake worker that reads the objects
the jobs reference."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.api.conftest import (
    Api,
    OpenApi,
    count_jobs,
    created_uri,
    fake_worker,
    read_job,
)
from tests.api.test_oip import request_of, result_of
from tffleet import tensors
from tffleet.objectstore import ObjectStore, keys

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

INLINE_MAX_BYTES = 64
BIG = np.arange(64, dtype=np.float32).reshape(16, 4)  # 256 bytes: over the limit
SMALL = BIG[:2]  # 32 bytes: inline


def mlp(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Version 2 of the fake fleet's mlp: x (n, 4) to y (n, 3)."""
    return {"y": inputs["x"][:, :3] * 2}


@pytest.fixture
async def api(object_store: ObjectStore, open_api: OpenApi) -> AsyncIterator[Api]:
    """The app on the test's store, inputs over 64 bytes going to it."""
    async with open_api(inline_max_bytes=INLINE_MAX_BYTES) as running:
        yield running


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


async def uploaded(api: Api, array: np.ndarray) -> str:
    response = await api.client.post(
        "/v1/uploads", content=npy(array), headers={"Content-Type": tensors.NPY}
    )
    return created_uri(response)


def assert_stored_by_its_job(api: Api, store: ObjectStore, job_id: str) -> None:
    """The job's input x is an object under its own inputs/, accounted in stored_bytes; no
    tensor bytes in its row."""
    job = read_job(api.sessions, job_id)
    ref = tensors.references(job.inputs)["x"]
    assert ref.key == keys.input_key("default", job_id, "x")
    assert job.stored_bytes == store.size(ref.key)
    assert len(job.inputs) < BIG.nbytes
    assert tensors.unpack(job.inputs, inline_only=True) == {}


def assert_references_upload(api: Api, job_id: str, uri: str) -> None:
    upload_id = keys.parse_upload_uri(uri)
    assert upload_id is not None
    job = read_job(api.sessions, job_id)
    assert tensors.references(job.inputs)["x"].key == keys.upload_key("default", upload_id)
    assert job.stored_bytes is None  # the upload's bytes are the upload's, not the job's


# ─── TF Serving ───────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("form", ["instances", "inputs"])
async def test_tf_serving_puts_a_large_input_in_the_store(
    api: Api, object_store: ObjectStore, redis_url: str, form: str
) -> None:
    with fake_worker(api.sessions, redis_url, mlp, object_store) as done:
        response = await api.client.post("/v1/models/mlp:predict", json={form: BIG.tolist()})
    assert response.status_code == 200, response.text
    answer = response.json()["predictions" if form == "instances" else "outputs"]
    np.testing.assert_allclose(answer, mlp({"x": BIG})["y"])
    (job_id,) = done
    assert_stored_by_its_job(api, object_store, job_id)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_tf_serving_keeps_a_small_input_inline(
    api: Api, object_store: ObjectStore, redis_url: str
) -> None:
    with fake_worker(api.sessions, redis_url, mlp, object_store) as done:
        response = await api.client.post(
            "/v1/models/mlp:predict", json={"instances": SMALL.tolist()}
        )
    assert response.status_code == 200, response.text
    (job_id,) = done
    job = read_job(api.sessions, job_id)
    assert tensors.references(job.inputs) == {} and job.stored_bytes is None


@pytest.mark.parametrize("by_name", [True, False], ids=["by-name", "one-tensor"])
async def test_tf_serving_columnar_inputs_name_an_upload(
    api: Api, object_store: ObjectStore, redis_url: str, by_name: bool
) -> None:
    uri = await uploaded(api, BIG)
    inputs: Any = {"x": {"uri": uri}} if by_name else {"uri": uri}
    with fake_worker(api.sessions, redis_url, mlp, object_store) as done:
        response = await api.client.post("/v1/models/mlp:predict", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["outputs"], mlp({"x": BIG})["y"])
    (job_id,) = done
    assert_references_upload(api, job_id, uri)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"uri": "tffleet://uploads/" + "0" * 32}, "inputs.x: no upload tffleet://uploads/000"),
        ({"uri": "https://example.com/x.npy"}, "inputs.x: https:// URIs are not fetched"),
        ({"uri": "tffleet://uploads/0", "dtype": "float32"}, "inputs.x: a reference is"),
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_tf_serving_refuses_a_uri_that_names_no_upload(
    api: Api, value: dict[str, Any], says: str
) -> None:
    response = await api.client.post("/v1/models/mlp:predict", json={"inputs": {"x": value}})
    assert response.status_code == 400, response.text
    assert says in response.json()["error"]
    assert count_jobs(api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_tf_serving_refuses_an_upload_that_does_not_fit(api: Api) -> None:
    uri = await uploaded(api, BIG.astype(np.float64))
    response = await api.client.post("/v1/models/mlp:predict", json={"inputs": {"x": {"uri": uri}}})
    assert response.status_code == 400, response.text
    assert "expected dtype float32, got float64" in response.json()["error"]
    assert count_jobs(api.sessions) == 0


# ─── The Open Inference Protocol ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
async def test_oip_puts_a_large_input_in_the_store(
    api: Api, object_store: ObjectStore, redis_url: str, binary: bool
) -> None:
    body, headers = request_of({"x": BIG}, binary=binary)
    with fake_worker(api.sessions, redis_url, mlp, object_store) as done:
        response = await api.client.post("/v2/models/mlp/infer", content=body, headers=headers)
    np.testing.assert_allclose(result_of(response).as_numpy("y"), mlp({"x": BIG})["y"])
    (job_id,) = done
    assert_stored_by_its_job(api, object_store, job_id)


def _by_reference(uri: Any, shape: list[int], **parameters: Any) -> tuple[bytes, dict[str, str]]:
    item = {
        "name": "x",
        "shape": shape,
        "datatype": "FP32",
        "parameters": {"tffleet_uri": uri, **parameters},
    }
    return orjson.dumps({"inputs": [item]}), {"Content-Type": "application/json"}


async def test_oip_an_input_names_an_upload_in_its_parameters(
    api: Api, object_store: ObjectStore, redis_url: str
) -> None:
    uri = await uploaded(api, BIG)
    body, headers = _by_reference(uri, list(BIG.shape))
    with fake_worker(api.sessions, redis_url, mlp, object_store) as done:
        response = await api.client.post("/v2/models/mlp/infer", content=body, headers=headers)
    np.testing.assert_allclose(result_of(response).as_numpy("y"), mlp({"x": BIG})["y"])
    (job_id,) = done
    assert_references_upload(api, job_id, uri)


@pytest.mark.parametrize(
    ("uri", "shape", "extra", "says"),
    [
        (None, [16, 4], {}, "inputs.x.shape: the request says [16, 4], its upload holds [8, 4]"),
        (None, [8, 4], {"binary_data_size": 4}, "inputs[0]: give either `data`"),
        (7, [8, 4], {}, "inputs[0].parameters.tffleet_uri: expected a string"),
        ("tffleet://uploads/" + "0" * 32, [8, 4], {}, "inputs.x: no upload"),
        ("s3://bucket/x.npy", [8, 4], {}, "inputs.x: s3:// URIs are not fetched"),
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_oip_refuses_a_reference_that_does_not_fit(
    api: Api, uri: Any, shape: list[int], extra: dict[str, Any], says: str
) -> None:
    uri = uri or await uploaded(api, BIG[:8])
    body, headers = _by_reference(uri, shape, **extra)
    response = await api.client.post("/v2/models/mlp/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert says in response.json()["error"], response.json()
    assert count_jobs(api.sessions) == 0
