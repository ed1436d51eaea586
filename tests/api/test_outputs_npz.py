"""An .npz answer (`Accept: application/x-npz`) of a job with outputs held in the object store
(api/npz_answer.py): the inline outputs and the stored ones read from the store, in one answer,
up to TFFLEET_MAX_BODY_BYTES of stored objects; past that, JSON with references; an object gone
is a 410, a store that does not answer a 503, as `GET /v1/jobs/{id}/outputs/{name}` answers.

No worker runs: `finish_with_references` (tests/api/test_outputs.py) plays one.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import httpx
import numpy as np
import orjson
import pytest

from db.models import DEFAULT_TENANT
from tests.api.conftest import Api, OpenApi, finish_job
from tests.api.test_outputs import (
    BIG,
    ROW,
    SMALL,
    finish_with_references,
    finished_when_queued,
    submit,
)
from tffleet import tensors
from tffleet.objectstore import ObjectStore, keys, open_store

pytestmark = pytest.mark.anyio

ACCEPT = {"Accept": f"{tensors.NPZ}, application/json"}
BIG_OBJECT = len(tensors.write_npy(BIG))  # what the store holds of it: header and bytes


@pytest.fixture
async def api(open_api: OpenApi, store_url: str) -> AsyncIterator[Api]:
    """The bound (TFFLEET_MAX_BODY_BYTES) is BIG's object, exactly."""
    async with open_api(object_store=store_url, max_body_bytes=BIG_OBJECT) as running:
        yield running


@pytest.fixture
async def finished(api: Api, store: ObjectStore) -> str:
    """A job that succeeded with `small` inline and `big` in the store."""
    job_id = await submit(api.client)
    finish_with_references(
        api.sessions, store, job_id, inline={"small": SMALL}, stored={"big": BIG}
    )
    return job_id


def npz(response: httpx.Response) -> dict[str, np.ndarray]:
    """The arrays as np.load reads them, checked against the client's own reader."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == tensors.NPZ
    with np.load(io.BytesIO(response.content), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    read = tensors.read_npz(response.content)
    assert list(read) == list(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(read[name], array)
    return arrays


@pytest.mark.parametrize("object_store_url", ["file", "s3"], indirect=True)
async def test_an_npz_answer_carries_a_stored_output_read_from_either_store(
    open_api: OpenApi, object_store_url: str, object_store: ObjectStore
) -> None:
    async with open_api(object_store=object_store_url, max_body_bytes=1 << 20) as api:
        job_id = await submit(api.client)
        finish_with_references(
            api.sessions, object_store, job_id, inline={"small": SMALL}, stored={"big": BIG}
        )

        response = await api.client.get(f"/v1/jobs/{job_id}", headers=ACCEPT)

    arrays = npz(response)
    assert list(arrays) == ["small", "big"]
    np.testing.assert_array_equal(arrays["small"], SMALL)
    np.testing.assert_array_equal(arrays["big"], BIG)
    assert int(response.headers["content-length"]) == len(response.content)  # gathered: small
    job = orjson.loads(response.headers["tffleet-job"])
    assert job["id"] == job_id and job["status"] == "succeeded" and job["outputs"] is None
    assert response.headers["vary"] == "Accept"


async def test_stored_objects_up_to_the_bound_are_read_and_one_byte_more_is_json(
    open_api: OpenApi, store_url: str, store: ObjectStore
) -> None:
    """The bound is TFFLEET_MAX_BODY_BYTES, counted in the objects' bytes (headers too)."""
    for bound, media in [(BIG_OBJECT, tensors.NPZ), (BIG_OBJECT - 1, "application/json")]:
        async with open_api(object_store=store_url, max_body_bytes=bound) as api:
            job_id = await submit(api.client)
            finish_with_references(api.sessions, store, job_id, inline={}, stored={"big": BIG})

            response = await api.client.get(f"/v1/jobs/{job_id}", headers=ACCEPT)

        assert response.status_code == 200
        assert response.headers["content-type"] == media
    outputs = response.json()["outputs"]  # past the bound: the reference, fetched apart
    assert outputs["big"]["uri"] == f"tffleet://jobs/{job_id}/outputs/big"


async def test_a_large_answer_is_streamed_in_chunks_without_a_length(
    open_api: OpenApi, store_url: str, store: ObjectStore
) -> None:
    """Over 1 MiB of objects, the zip is written as they are read (members' CRC and sizes in
    data descriptors): no Content-Length, and np.load and the client's reader read it."""
    large = np.arange(3 * 1_000_000, dtype=np.float32).reshape(3, 1_000_000)  # 12 MB
    other = np.full((2, 300_000), 7, dtype=np.int64)  # 4.8 MB
    async with open_api(object_store=store_url, max_body_bytes=64 << 20) as api:
        job_id = await submit(api.client)
        finish_with_references(
            api.sessions, store, job_id, inline={"small": SMALL}, stored={"y": large, "z": other}
        )

        response = await api.client.get(f"/v1/jobs/{job_id}", headers=ACCEPT)

    arrays = npz(response)
    assert "content-length" not in response.headers
    assert list(arrays) == ["small", "y", "z"]
    np.testing.assert_array_equal(arrays["y"], large)
    np.testing.assert_array_equal(arrays["z"], other)


async def test_an_npz_read_of_a_job_whose_stored_output_is_gone_is_410(
    api: Api, finished: str, store: ObjectStore
) -> None:
    store.delete([keys.output_key(DEFAULT_TENANT, finished, "big")])

    response = await api.client.get(f"/v1/jobs/{finished}", headers=ACCEPT)

    assert response.status_code == 410
    error = response.json()["error"]
    assert error["code"] == "outputs_gone" and "'big'" in error["message"]
    # Read as JSON, the job is still there, its output a reference.
    assert (await api.client.get(f"/v1/jobs/{finished}")).status_code == 200


async def test_an_npz_read_while_the_store_does_not_answer_is_503(
    api: Api, finished: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real S3 store whose endpoint nobody listens on (port 1), tried for 0.1 s."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setattr(api.state, "objects", open_store("s3://nowhere", retry_s=0.1))

    response = await api.client.get(f"/v1/jobs/{finished}", headers=ACCEPT)

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "object_store_unavailable"


async def test_a_string_output_beside_a_stored_one_is_still_json(
    api: Api, store: ObjectStore
) -> None:
    job_id = await submit(api.client)
    words = np.array([b"a", b"bc"], dtype=object)
    finish_with_references(api.sessions, store, job_id, inline={"w": words}, stored={"big": BIG})

    response = await api.client.get(f"/v1/jobs/{job_id}", headers=ACCEPT)

    assert response.headers["content-type"] == "application/json"
    assert response.json()["outputs"]["w"] == ["a", "bc"]


async def test_a_job_without_stored_outputs_is_the_npz_it_was(api: Api) -> None:
    job_id = await submit(api.client)
    finish_job(api.sessions, job_id, {"y": SMALL})

    response = await api.client.get(f"/v1/jobs/{job_id}", headers=ACCEPT)

    np.testing.assert_array_equal(npz(response)["y"], SMALL)
    assert response.content == tensors.write_npz({"y": SMALL})


@pytest.mark.parametrize("gone", [False, True])
async def test_a_submission_held_until_done_answers_its_stored_outputs_too(
    api: Api, store: ObjectStore, redis_url: str, gone: bool
) -> None:
    """`POST /v1/jobs?wait=` (Client.run's one round trip): an .npz with the stored output; its
    object gone, JSON with the reference (the job is stored: a 410 would have a client that
    retries without a key submit it again)."""
    with finished_when_queued(api, store, redis_url, stored={"big": BIG}, gone=gone):
        response = await api.client.post(
            "/v1/jobs",
            params={"wait": 10, "encoding": "b64"},
            json={"model": "mlp", "inputs": [ROW]},
            headers=ACCEPT,
        )

    assert response.status_code == 202, response.text
    if gone:
        assert response.headers["content-type"] == "application/json"
        assert response.json()["outputs"]["big"]["uri"].endswith("/outputs/big")
    else:
        assert response.headers["content-type"] == tensors.NPZ
        arrays = tensors.read_npz(response.content)
        np.testing.assert_array_equal(arrays["big"], BIG)
