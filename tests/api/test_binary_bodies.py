"""Binary bodies: POST /v1/jobs with an .npz or .npy body (the job's other fields in the query),
and a succeeded job's outputs answered as an .npz (`Accept: application/x-npz`)."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from api.ingest import BLOB, job_view
from db import jobs
from db.models import JobErrorCode
from tests.api.conftest import (
    MAX_BODY_BYTES,
    Api,
    OpenApi,
    assert_nothing_left,
    count_jobs,
    envelope,
    finish_job,
    queued_messages,
    read_job,
    task_args,
)
from tests.api.test_submit_wait import OUTPUTS as WORKER_OUTPUTS
from tests.api.test_submit_wait import FakeWorker
from tffleet import tensors
from tffleet.announcements import EndedJob

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]
FinishLater = Callable[..., Any]

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
OUTPUTS = {"y": np.array([[0.5, -1.25, 3.0e-8]], dtype=np.float32)}


def npz(**arrays: np.ndarray) -> bytes:
    """What `np.savez` writes: numpy's own writer, not ours."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


async def post_binary(
    client: httpx.AsyncClient,
    body: bytes,
    *,
    content_type: str = tensors.NPZ,
    headers: dict[str, str] | None = None,
    **params: Any,
) -> httpx.Response:
    params.setdefault("model", "mlp")
    return await client.post(
        "/v1/jobs",
        params={k: v for k, v in params.items() if v is not None},
        content=body,
        headers={"Content-Type": content_type, **(headers or {})},
    )


def stored_inputs(sessions: Sessions, job_id: str) -> dict[str, np.ndarray]:
    job = read_job(sessions, job_id)
    assert job.inputs is not None
    return tensors.unpack(job.inputs)


def assert_refused(
    response: httpx.Response, status: int, code: str, starts: str, sessions: Sessions, broker: Any
) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"].startswith(starts), error["message"]
    assert_nothing_left(sessions, broker)
    message: str = error["message"]
    return message


# Accepted


async def test_an_npz_body_is_one_job_stored_as_its_json_twin_would_be(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    response = await post_binary(client, npz(x=X), version=1, priority=5, ttl_s=60)

    assert response.status_code == 202, response.text
    assert response.headers["content-type"] == "application/json"
    job = response.json()
    assert (job["model"], job["version"], job["priority"], job["status"]) == ("mlp", 1, 5, "queued")
    row = read_job(sessions, job["id"])
    assert row.samples == 3 and row.ttl_s == 60
    stored = stored_inputs(sessions, job["id"])
    assert list(stored) == ["x"] and stored["x"].dtype == np.float32
    np.testing.assert_array_equal(stored["x"], X)  # bit for bit
    [message] = queued_messages(broker, "tffleet.mlp")
    assert task_args(message)[2] == [job["id"]]

    twin = await client.post(
        "/v1/jobs", json={"model": "mlp", "version": 1, "inputs": {"x": envelope(X)}}
    )
    assert read_job(sessions, twin.json()["id"]).inputs == row.inputs  # the same blob


async def test_an_npy_body_is_the_bare_tensor_of_a_single_input_model(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    response = await post_binary(client, npy(X), content_type=tensors.NPY)

    assert response.status_code == 202, response.text
    assert response.json()["version"] == 2  # the latest, as without a version in JSON
    np.testing.assert_array_equal(stored_inputs(sessions, response.json()["id"])["x"], X)


async def test_every_input_of_a_model_is_a_member_by_name(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    a, b = np.ones((2, 3), np.float32), np.zeros((2, 2), np.float32)

    response = await post_binary(client, tensors.write_npz({"a": a, "b": b}), model="pair")

    assert response.status_code == 202, response.text
    stored = stored_inputs(sessions, response.json()["id"])
    assert sorted(stored) == ["a", "b"]
    np.testing.assert_array_equal(stored["b"], b)


async def test_fortran_order_and_big_endian_arrays_are_stored_c_order_little_endian(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    ids = np.asfortranarray(np.arange(6, dtype=">i4").reshape(2, 3))

    response = await post_binary(client, npz(ids=ids), model="count")

    assert response.status_code == 202, response.text
    stored = stored_inputs(sessions, response.json()["id"])["ids"]
    assert stored.dtype == np.dtype("<i4") and stored.flags.c_contiguous
    np.testing.assert_array_equal(stored, ids)


async def test_a_content_type_with_parameters_is_read_by_its_media_type(
    client: httpx.AsyncClient,
) -> None:
    response = await post_binary(client, npz(x=X), content_type="Application/X-NPZ; v=1")

    assert response.status_code == 202, response.text


# Refused: the same statuses and messages naming the field as a JSON body's


@pytest.mark.parametrize(
    ("body", "content_type", "starts"),
    [
        (b"", tensors.NPZ, "body: empty; expected an .npz file"),
        (b"PK\x03\x04 not a zip", tensors.NPZ, "body: not an .npz archive"),
        (npy(X), tensors.NPZ, "body: not an .npz archive"),
        (npz(x=X), tensors.NPY, "body: not an .npy array"),
        (npy(X)[:-1], tensors.NPY, "body: holds 47 bytes of data but dtype float32"),
    ],
    ids=["empty", "junk", "npy-as-npz", "npz-as-npy", "cut-short"],
)
async def test_a_body_that_is_not_what_its_content_type_says_is_400(
    client: httpx.AsyncClient,
    sessions: Sessions,
    broker: redis.Redis,
    body: bytes,
    content_type: str,
    starts: str,
) -> None:
    response = await post_binary(client, body, content_type=content_type)

    assert_refused(response, 400, "malformed_request", starts, sessions, broker)


async def test_a_compressed_npz_is_400_naming_its_member(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=X)

    response = await post_binary(client, buffer.getvalue())

    message = assert_refused(response, 400, "malformed_request", "body: ", sessions, broker)
    assert "member 'x.npy' is compressed" in message and "np.savez" in message


async def test_an_object_array_is_never_unpickled(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([[object()]], dtype=object), allow_pickle=True)

    response = await post_binary(client, buffer.getvalue())

    message = assert_refused(response, 400, "malformed_request", "body: ", sessions, broker)
    assert "member 'x.npy'" in message and "pickle" in message


async def test_a_body_over_the_limit_is_413(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    big = np.zeros((MAX_BODY_BYTES // 16 + 1, 4), np.float32)

    response = await post_binary(client, npz(x=big))

    assert_refused(response, 413, "payload_too_large", "body of ", sessions, broker)


async def test_an_unknown_content_type_is_415_listing_the_accepted_ones(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    response = await post_binary(client, npz(x=X), content_type="application/zip")

    message = assert_refused(response, 415, "unsupported_media_type", "", sessions, broker)
    assert message == (
        "Content-Type must be one of application/json, application/x-npz, application/x-npy"
    )


@pytest.mark.parametrize(
    ("params", "body", "starts"),
    [
        ({"model": None}, None, "model: Field required"),
        ({"model": "no such"}, None, "model: String should match pattern"),
        ({"priority": "high"}, None, "priority: Input should be a valid integer"),
        ({"version": "0"}, None, "version: Input should be greater than or equal to 1"),
        ({"ttl_s": "0"}, None, "ttl_s: Input should be greater than or equal to 1"),
        ({}, {"x": X.astype(np.int64)}, "inputs.x: expected dtype float32, got int64"),
        ({}, {"x": X[:, :3]}, "inputs.x: dimension 1 must be 4 (shape [None, 4])"),
        ({}, {"x": X[0]}, "inputs.x: expected rank 2"),
        ({}, {"x": X, "z": X}, "inputs: unknown ['z']; model 'mlp' takes ['x']"),
        ({}, {"y": X}, "inputs: missing ['x']"),
        ({}, {"x": np.full((1, 4), np.nan, np.float32)}, "inputs.x: contains NaN or infinity"),
        ({}, {"x": np.zeros((0, 4), np.float32)}, "inputs.x: the batch is empty"),
    ],
    ids=[
        "no-model", "bad-model", "priority", "version", "ttl", "dtype", "shape", "rank",
        "unknown", "missing", "nan", "empty",
    ],
)  # fmt: skip
async def test_fields_and_inputs_that_do_not_fit_are_422_naming_them(
    client: httpx.AsyncClient,
    sessions: Sessions,
    broker: redis.Redis,
    params: dict[str, Any],
    body: dict[str, np.ndarray] | None,
    starts: str,
) -> None:
    response = await post_binary(client, npz(**(body or {"x": X})), **params)

    assert_refused(response, 422, "invalid_input", starts, sessions, broker)


async def test_a_bare_npy_for_a_model_of_two_inputs_is_422(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    response = await post_binary(client, npy(X), content_type=tensors.NPY, model="pair")

    assert_refused(
        response, 422, "invalid_input", "inputs: model 'pair' has 2 inputs", sessions, broker
    )


async def test_an_unknown_model_or_version_is_404(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    unknown = await post_binary(client, npz(x=X), model="nope")
    old = await post_binary(client, npz(x=X), version=9)

    assert unknown.status_code == old.status_code == 404
    assert "nope" in unknown.json()["error"]["message"]
    assert_nothing_left(sessions, broker)


@pytest.mark.parametrize("query", ["priority=5", "wait=1&priority=5", "pri%6Frity=5"])
async def test_a_json_body_with_the_binary_query_parameters_is_422(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis, query: str
) -> None:
    response = await client.post(f"/v1/jobs?{query}", json={"model": "mlp", "inputs": X.tolist()})

    assert_refused(
        response, 422, "invalid_input", "priority: a query parameter only with a binary body",
        sessions, broker,
    )  # fmt: skip


# Keys, tenants, quotas: as for JSON


async def test_no_api_key_is_401_before_the_body_is_read(
    api: Api, sessions: Sessions, broker: redis.Redis
) -> None:
    response = await api.client.post(
        "/v1/jobs",
        params={"model": "mlp"},
        content=b"not even an npz",
        headers={"Content-Type": tensors.NPZ, "Authorization": "Bearer tff_nope_nope"},
    )

    assert_refused(response, 401, "unauthorized", "", sessions, broker)


async def test_the_same_key_and_arrays_are_the_same_job_however_they_were_sent(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    key = {"Idempotency-Key": "npz-17"}
    first = await post_binary(client, npz(x=X), headers=key)
    again = await post_binary(client, tensors.write_npz({"x": X}), headers=key)
    as_npy = await post_binary(client, npy(X), content_type=tensors.NPY, headers=key)
    as_json = await client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": envelope(X)}}, headers=key
    )
    other = await post_binary(client, npz(x=X + 1), headers=key)

    assert first.headers["Idempotent-Replayed"] == "false"
    assert [r.headers["Idempotent-Replayed"] for r in (again, as_npy, as_json)] == ["true"] * 3
    assert len({r.json()["id"] for r in (first, again, as_npy, as_json)}) == 1
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert count_jobs(sessions) == 1


async def test_a_tenant_key_submits_within_its_limits(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(tenant_max_priority=3, tenant_max_samples_per_job=2) as api:
        acme = api.key("acme")
        too_urgent = await post_binary(api.client, npz(x=X[:1]), priority=4, headers=acme)
        too_many = await post_binary(api.client, npz(x=X), headers=acme)
        fine = await post_binary(api.client, npz(x=X[:2]), priority=3, headers=acme)
        other = await api.client.get(f"/v1/jobs/{fine.json()['id']}", headers=api.key("globex"))

    assert too_urgent.status_code == too_many.status_code == 422
    assert too_urgent.json()["error"]["message"].startswith("priority: at most 3")
    assert too_many.json()["error"]["message"].startswith("inputs: 3 samples")
    assert fine.status_code == 202
    assert read_job(sessions, fine.json()["id"]).tenant == "acme"
    assert other.status_code == 404
    assert count_jobs(sessions) == 1


# Outputs back in .npz


def read_npz_answer(response: httpx.Response) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    assert response.headers["content-type"] == tensors.NPZ
    job = orjson.loads(response.headers["tffleet-job"])
    with np.load(io.BytesIO(response.content)) as archive:  # numpy's own reader
        return job, {name: archive[name] for name in archive.files}


async def test_a_succeeded_job_is_answered_as_an_npz_with_the_job_in_a_header(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = (await post_binary(client, npz(x=X))).json()["id"]
    outputs = {"y": OUTPUTS["y"], "ids": np.array([[1, -(2**40)]], dtype=np.int64)}
    finish_job(sessions, job_id, outputs)
    as_json = (await client.get(f"/v1/jobs/{job_id}")).json()

    response = await client.get(f"/v1/jobs/{job_id}", headers={"Accept": tensors.NPZ})

    assert response.status_code == 200 and response.headers["vary"] == "Accept"
    assert response.headers["content-disposition"] == f'attachment; filename="{job_id}.npz"'
    job, arrays = read_npz_answer(response)
    assert job == {**as_json, "outputs": None}
    assert sorted(arrays) == ["ids", "y"]
    for name, expected in outputs.items():
        assert arrays[name].dtype == expected.dtype
        np.testing.assert_array_equal(arrays[name], expected)  # bit for bit


@pytest.mark.parametrize(
    "accept",
    ["application/x-npz, application/json", "application/json;q=0.5, application/x-npz;q=0.9"],
)
async def test_an_accept_that_lists_npz_among_others_gets_npz(
    client: httpx.AsyncClient, sessions: Sessions, accept: str
) -> None:
    job_id = (await post_binary(client, npz(x=X))).json()["id"]
    finish_job(sessions, job_id, OUTPUTS)

    response = await client.get(f"/v1/jobs/{job_id}", headers={"Accept": accept})

    assert read_npz_answer(response)[0]["status"] == "succeeded"


@pytest.mark.parametrize("accept", ["application/x-npz;q=0", "application/json", "*/*"])
async def test_without_npz_in_accept_the_answer_is_json(
    client: httpx.AsyncClient, sessions: Sessions, accept: str
) -> None:
    job_id = (await post_binary(client, npz(x=X))).json()["id"]
    finish_job(sessions, job_id, OUTPUTS)

    response = await client.get(f"/v1/jobs/{job_id}", headers={"Accept": accept})

    assert response.headers["content-type"] == "application/json"
    assert response.json()["outputs"] == {"y": OUTPUTS["y"].tolist()}


async def test_a_job_that_has_not_succeeded_is_json_whatever_the_accept(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    queued = (await post_binary(client, npz(x=X))).json()
    failed = (await post_binary(client, npz(x=X))).json()
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[failed["id"]], owner="w", lease_s=60)
        jobs.fail(session=session, leases=leases, code=JobErrorCode.MODEL_ERROR, message="boom")
    npz_first = {"Accept": f"{tensors.NPZ}, application/json"}

    still = await client.get(f"/v1/jobs/{queued['id']}", headers=npz_first)
    ended = await client.get(f"/v1/jobs/{failed['id']}", headers=npz_first)

    assert still.headers["content-type"] == ended.headers["content-type"] == "application/json"
    assert still.json() == queued
    assert ended.json()["status"] == "failed" and ended.json()["error"]["code"] == "model_error"


async def test_string_outputs_come_back_as_json_in_the_encoding_asked_for(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = (await post_binary(client, npz(x=X))).json()["id"]
    finish_job(sessions, job_id, {"label": np.array([b"cat", b"\xff"], dtype=object)})

    response = await client.get(
        f"/v1/jobs/{job_id}", params={"encoding": "b64"}, headers={"Accept": tensors.NPZ}
    )

    assert response.headers["content-type"] == "application/json"
    assert response.json()["outputs"] == {"label": [{"b64": "Y2F0"}, {"b64": "/w=="}]}


async def test_a_long_poll_that_sees_the_job_succeed_answers_npz(
    api: Api, redis_url: str, finish_later: FinishLater
) -> None:
    job_id = (await post_binary(api.client, npz(x=X))).json()["id"]
    finish_later(job_id, OUTPUTS, delay_s=0.3, announce_to=redis_url)

    started = time.monotonic()
    response = await api.client.get(
        f"/v1/jobs/{job_id}", params={"wait": "10"}, headers={"Accept": tensors.NPZ}
    )

    assert time.monotonic() - started < 5
    job, arrays = read_npz_answer(response)
    assert job["status"] == "succeeded"
    np.testing.assert_array_equal(arrays["y"], OUTPUTS["y"])


async def test_submit_with_wait_and_accept_npz_answers_202_with_the_outputs(
    api: Api, sessions: Sessions, redis_url: str
) -> None:
    with FakeWorker(sessions, redis_url, [0.1]):
        response = await post_binary(
            api.client,
            npz(x=X),
            wait="10",
            headers={"Accept": tensors.NPZ, "Idempotency-Key": "wait-npz"},
        )

    assert response.status_code == 202
    assert response.headers["Idempotent-Replayed"] == "false"
    job, arrays = read_npz_answer(response)
    assert job["status"] == "succeeded" and job["outputs"] is None
    np.testing.assert_array_equal(arrays["y"], WORKER_OUTPUTS["y"])


async def test_a_tenant_does_not_see_the_worker_in_the_header(api: Api, sessions: Sessions) -> None:
    acme = api.key("acme")
    job_id = (await post_binary(api.client, npz(x=X), headers=acme)).json()["id"]
    finish_job(sessions, job_id, OUTPUTS)

    own = await api.client.get(f"/v1/jobs/{job_id}", headers={**acme, "Accept": tensors.NPZ})
    admin = await api.client.get(f"/v1/jobs/{job_id}", headers={"Accept": tensors.NPZ})

    assert read_npz_answer(own)[0]["worker"] is None
    assert read_npz_answer(admin)[0]["worker"] == "test-worker"


def test_a_job_announced_whole_is_read_with_its_outputs_as_their_blob() -> None:
    blob = tensors.pack(OUTPUTS)
    now = datetime.now(UTC)
    ended = EndedJob(
        id="j1", model="mlp", version=2, priority=0, created_at=now, started_at=now,
        finished_at=now, attempts=1, worker="w", outputs=blob,
    )  # fmt: skip

    view = job_view(ended, BLOB)

    assert view["outputs"] == blob and view["status"] == "succeeded"
    assert job_view(ended, "b64")["outputs"]["y"]["dtype"] == "float32"


# The contract's description


async def test_the_openapi_schema_lists_the_binary_bodies_and_answers(
    client: httpx.AsyncClient,
) -> None:
    schema = (await client.get("/openapi.json")).json()
    submit = schema["paths"]["/v1/jobs"]["post"]
    get = schema["paths"]["/v1/jobs/{job_id}"]["get"]

    assert {"application/json", tensors.NPZ, tensors.NPY} <= set(submit["requestBody"]["content"])
    assert {"model", "version", "priority", "ttl_s"} <= {p["name"] for p in submit["parameters"]}
    assert tensors.NPZ in submit["responses"]["202"]["content"]
    assert {"application/json", tensors.NPZ} <= set(get["responses"]["200"]["content"])
    assert "Tffleet-Job" in get["description"]
