"""Outputs by reference (DESIGN §13): a job's JSON names an output held in the object store as
`{"uri", "dtype", "shape"}`, and `GET /v1/jobs/{id}/outputs/{name}` streams it as an .npy.

No worker runs: a test plays one, writing the output's .npy to the store under the job's key and
completing the job with a packed blob that holds a `Reference` to it, as the worker does. The
store is a directory under tmp_path, and the run's own S3 server (SeaweedFS) where a test is
about the store itself.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import anyio
import httpx
import numpy as np
import orjson
import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import DEFAULT_TENANT, Job, JobStatus
from tests.api.conftest import Api, OpenApi, _until_subscribed, finish_job
from tffleet import tensors
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.objectstore import ObjectStore, keys, open_store

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

ROW = [1.0, 2.0, 3.0, 4.0]
BIG = np.arange(3 * 5000, dtype=np.float32).reshape(3, 5000) / 7  # "too big to inline"
SMALL = np.array([[0.5, -1.25]], dtype=np.float32)


def finish_with_references(
    sessions: Sessions,
    store: ObjectStore,
    job_id: str,
    *,
    inline: Mapping[str, np.ndarray],
    stored: Mapping[str, np.ndarray],
    tenant: str = DEFAULT_TENANT,
) -> None:
    """Complete a job as the worker does when outputs exceed the inline limit: each of `stored`
    a whole .npy in the store under the job's key, the blob holding a Reference to it."""
    references = {}
    for name, array in stored.items():
        key = keys.output_key(tenant, job_id, name)
        body = tensors.write_npy(array)
        store.put(key, body)
        references[name] = tensors.Reference(
            key=key,
            dtype=array.dtype.name,
            shape=tuple(array.shape),
            offset=len(body) - array.nbytes,
            nbytes=array.nbytes,
        )
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="test-worker", lease_s=60)
    blob = tensors.pack(inline, references)
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, blob)]) == 1


async def submit(client: httpx.AsyncClient, **headers: str) -> str:
    response = await client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": [ROW]}, headers=headers
    )
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


@pytest.fixture
async def api(open_api: OpenApi, store_url: str) -> AsyncIterator[Api]:
    async with open_api(object_store=store_url) as running:
        yield running


@pytest.fixture
async def finished(api: Api, store: ObjectStore) -> str:
    """A job that succeeded with `small` inline and `big` in the store."""
    job_id = await submit(api.client)
    finish_with_references(
        api.sessions, store, job_id, inline={"small": SMALL}, stored={"big": BIG}
    )
    return job_id


def npy(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == tensors.NPY
    assert int(response.headers["content-length"]) == len(response.content)
    array: np.ndarray = np.load(io.BytesIO(response.content), allow_pickle=False)
    return array


# The job's JSON


@pytest.mark.parametrize("encoding", ["json", "b64"])
async def test_the_job_names_a_stored_output_by_uri_and_keeps_inline_ones_as_they_were(
    api: Api, finished: str, encoding: str
) -> None:
    job = (await api.client.get(f"/v1/jobs/{finished}", params={"encoding": encoding})).json()

    assert job["outputs"]["big"] == {
        "uri": f"tffleet://jobs/{finished}/outputs/big",
        "dtype": "float32",
        "shape": [3, 5000],
    }
    small = job["outputs"]["small"]
    assert small == SMALL.tolist() if encoding == "json" else small["shape"] == [1, 2]


async def test_a_bulk_status_read_shows_the_same_reference(api: Api, finished: str) -> None:
    single = (await api.client.get(f"/v1/jobs/{finished}")).json()
    bulk = (await api.client.post("/v1/jobs/status", json={"ids": [finished]})).json()

    assert bulk["jobs"][0]["outputs"] == single["outputs"]


async def test_an_npz_read_of_a_job_with_a_stored_output_past_the_bound_is_answered_as_json(
    api: Api, finished: str
) -> None:
    """Stored outputs over TFFLEET_MAX_BODY_BYTES (the tests' 16 KiB; BIG's object is 60 KB)
    are not read into an .npz: the client fetches them (tests/api/test_outputs_npz.py: within)."""
    response = await api.client.get(
        f"/v1/jobs/{finished}",
        params={"encoding": "b64"},
        headers={"Accept": f"{tensors.NPZ}, application/json"},
    )

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    outputs = response.json()["outputs"]
    assert outputs["big"]["uri"].endswith("/outputs/big") and outputs["small"]["dtype"] == "float32"


async def test_a_job_without_stored_outputs_is_still_an_npz(api: Api) -> None:
    job_id = await submit(api.client)
    finish_job(api.sessions, job_id, {"y": SMALL})

    response = await api.client.get(f"/v1/jobs/{job_id}", headers={"Accept": tensors.NPZ})

    assert response.headers["content-type"] == tensors.NPZ


# GET /v1/jobs/{id}/outputs/{name}


@pytest.mark.parametrize("object_store_url", ["file", "s3"], indirect=True)
async def test_a_stored_output_is_streamed_from_either_store_as_the_npy_written(
    open_api: OpenApi, object_store_url: str, object_store: ObjectStore
) -> None:
    async with open_api(object_store=object_store_url) as api:
        job_id = await submit(api.client)
        finish_with_references(api.sessions, object_store, job_id, inline={}, stored={"big": BIG})

        response = await api.client.get(f"/v1/jobs/{job_id}/outputs/big")

    np.testing.assert_array_equal(npy(response), BIG)
    assert response.content == tensors.write_npy(BIG)  # the object as it is, byte for byte
    assert response.headers["content-disposition"] == 'attachment; filename="big.npy"'


async def test_a_large_output_goes_out_in_chunks_not_one_body(api: Api, store: ObjectStore) -> None:
    """Streamed: the app sends the object in the store's chunks (1 MiB), never joined. Seen at
    the ASGI interface itself (httpx's ASGITransport joins what the app sends)."""
    job_id = await submit(api.client)
    large = np.ones((3, 1_000_000), dtype=np.float32)  # 12 MB
    finish_with_references(api.sessions, store, job_id, inline={}, stored={"y": large})
    transport = api.client._transport
    assert isinstance(transport, httpx.ASGITransport)
    sent: list[dict[str, Any]] = []
    requested, done = False, anyio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()  # the client stays connected until the answer has ended
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": f"/v1/jobs/{job_id}/outputs/y", "raw_path": b"",
        "query_string": b"", "root_path": "", "server": ("tffleet", 80), "client": None,
        "headers": [(b"authorization", api.client.headers["authorization"].encode())],
    }  # fmt: skip
    await transport.app(scope, receive, send)

    start, *bodies = sent
    assert start["status"] == 200
    chunks = [m["body"] for m in bodies if m["body"]]
    assert len(chunks) > 1 and max(map(len, chunks)) <= 2 * 1024 * 1024
    assert (b"content-length", str(sum(map(len, chunks))).encode()) in start["headers"]
    body = b"".join(chunks)
    np.testing.assert_array_equal(np.load(io.BytesIO(body), allow_pickle=False), large)


async def test_an_inline_output_is_written_as_npy_on_the_fly(api: Api, finished: str) -> None:
    np.testing.assert_array_equal(
        npy(await api.client.get(f"/v1/jobs/{finished}/outputs/small")), SMALL
    )


async def test_an_unknown_output_name_is_404_naming_the_outputs_there_are(
    api: Api, finished: str
) -> None:
    response = await api.client.get(f"/v1/jobs/{finished}/outputs/nope")

    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert "'nope'" in message and "['big', 'small']" in message


async def test_an_unknown_job_and_another_tenants_job_are_404_alike(
    api: Api, finished: str
) -> None:
    unknown = await api.client.get("/v1/jobs/no-such-job/outputs/big")
    strangers = await api.client.get(
        f"/v1/jobs/{finished}/outputs/big", headers=api.key("someone-else")
    )

    assert unknown.status_code == strangers.status_code == 404
    assert unknown.json()["error"]["code"] == strangers.json()["error"]["code"] == "job_not_found"


async def test_the_jobs_own_tenant_reads_it(api: Api, store: ObjectStore) -> None:
    headers = api.key("acme")
    job_id = await submit(api.client, **headers)
    finish_with_references(
        api.sessions, store, job_id, inline={}, stored={"big": BIG}, tenant="acme"
    )

    response = await api.client.get(f"/v1/jobs/{job_id}/outputs/big", headers=headers)

    np.testing.assert_array_equal(npy(response), BIG)


async def test_without_a_key_it_is_401(api: Api, finished: str) -> None:
    response = await api.client.get(
        f"/v1/jobs/{finished}/outputs/big", headers={"Authorization": ""}
    )

    assert response.status_code == 401


async def test_a_job_that_has_not_succeeded_is_409(api: Api) -> None:
    job_id = await submit(api.client)

    response = await api.client.get(f"/v1/jobs/{job_id}/outputs/y")

    assert response.status_code == 409
    assert "queued" in response.json()["error"]["message"]


async def test_an_output_whose_object_is_gone_is_410(
    api: Api, finished: str, store: ObjectStore
) -> None:
    store.delete([keys.output_key(DEFAULT_TENANT, finished, "big")])

    response = await api.client.get(f"/v1/jobs/{finished}/outputs/big")

    assert response.status_code == 410
    error = response.json()["error"]
    assert error["code"] == "outputs_gone" and "'big'" in error["message"]


async def test_a_store_that_does_not_answer_is_503(
    api: Api, finished: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real S3 store whose endpoint nobody listens on (port 1), tried for 0.1 s."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setattr(api.state, "objects", open_store("s3://nowhere", retry_s=0.1))

    response = await api.client.get(f"/v1/jobs/{finished}/outputs/big")

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "object_store_unavailable"


async def test_a_string_output_is_422_pointing_at_the_jobs_json(api: Api) -> None:
    job_id = await submit(api.client)
    finish_job(api.sessions, job_id, {"text": np.array([b"a", b"bc"], dtype=object)})

    response = await api.client.get(f"/v1/jobs/{job_id}/outputs/text")

    assert response.status_code == 422
    message = response.json()["error"]["message"]
    assert message.startswith("name: ") and f"GET /v1/jobs/{job_id}" in message


async def test_the_route_is_in_the_openapi_schema_with_the_bearer_scheme(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()

    operation = schema["paths"]["/v1/jobs/{job_id}/outputs/{name}"]["get"]
    assert operation["security"] == [{"bearer": []}]
    assert tensors.NPY in operation["responses"]["200"]["content"]
    assert {"404", "409", "410", "503"} <= set(operation["responses"])


# The protocols: an answer holds every value, so a stored output is read whole


@pytest.mark.parametrize("gone", [False, True])
async def test_a_tf_serving_predict_answers_an_output_held_in_the_store(
    api: Api, store: ObjectStore, redis_url: str, gone: bool
) -> None:
    y = np.array([[0.5, 1.5]], dtype=np.float32)
    with finished_when_queued(api, store, redis_url, stored={"y": y}, gone=gone):
        response = await api.client.post("/v1/models/mlp:predict", json={"instances": [ROW]})

    if gone:
        assert response.status_code == 410
        assert "'y'" in response.json()["error"]
    else:
        assert response.status_code == 200, response.text
        assert response.json() == {"predictions": y.tolist()}


@contextlib.contextmanager
def finished_when_queued(
    api: Api, store: ObjectStore, redis_url: str, *, stored: Mapping[str, np.ndarray], gone: bool
) -> Iterator[None]:
    """A fake worker, in a thread, for a request that waits on its job: once the job is queued,
    it ends it with `stored` outputs held in the store (deleted again where `gone`) and announces
    it. Leaving the block joins it and raises what it raised."""
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            _until_subscribed(redis_url)
            deadline = time.monotonic() + 10
            while not (queued := queued_ids(api.sessions)) and time.monotonic() < deadline:
                time.sleep(0.01)
            (job_id,) = queued
            finish_with_references(api.sessions, store, job_id, inline={}, stored=stored)
            if gone:
                store.delete([keys.output_key(DEFAULT_TENANT, job_id, name) for name in stored])
            with redis.Redis.from_url(redis_url) as client:
                client.publish(JOBS_DONE_CHANNEL, orjson.dumps([job_id]))
        except BaseException as exc:  # surfaced in the test's thread below
            errors.append(exc)

    thread = threading.Thread(target=worker, name="fake-worker", daemon=True)
    thread.start()
    yield
    thread.join(timeout=10)
    assert not errors, errors


def queued_ids(sessions: Sessions) -> list[str]:
    with sessions() as session:
        found = session.scalars(select(Job.id).where(Job.status == JobStatus.QUEUED.value))
        return list(found.all())


# The console


async def test_the_consoles_job_view_lists_a_stored_outputs_dtype_and_shape(
    api: Api, finished: str
) -> None:
    job = (await api.client.get(f"/v1/console/jobs/{finished}")).json()

    assert job["output_shapes"]["big"] == {
        "dtype": "float32",
        "shape": [3, 5000],
        "uri": f"tffleet://jobs/{finished}/outputs/big",
    }
    assert job["output_shapes"]["small"] == {"dtype": "float32", "shape": [1, 2]}
