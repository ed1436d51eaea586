"""POST /v1/jobs: what is accepted, what is stored and published, and every way it refuses."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from api import ingest
from db import jobs
from db.models import JobStatus
from tests.api.conftest import (
    DEAD_BROKER_URL,
    ISO_UTC,
    MAX_BODY_BYTES,
    OpenApi,
    Publication,
    assert_nothing_left,
    count_jobs,
    envelope,
    queued_messages,
    read_job,
    task_args,
)
from tffleet import tensors
from tffleet.broker import ONCE_MAX_JOBS

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

JOB_FIELDS = {
    "id",
    "model",
    "version",
    "status",
    "priority",
    "created_at",
    "started_at",
    "finished_at",
    "attempts",
    "error",
    "outputs",
}
ROW = [1.0, 2.0, 3.0, 4.0]


def stored_inputs(sessions: Sessions, job_id: str) -> dict[str, np.ndarray]:
    job = read_job(sessions, job_id)
    assert job.inputs is not None
    return tensors.unpack(job.inputs)


# Accepted


async def test_submit_returns_202_with_the_queued_job(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    response = await client.post(
        "/v1/jobs", json={"model": "mlp", "version": 1, "inputs": {"x": [ROW]}, "priority": 5}
    )
    assert response.status_code == 202
    assert response.headers["content-type"] == "application/json"
    job = response.json()
    assert set(job) >= JOB_FIELDS
    assert job["model"] == "mlp" and job["version"] == 1
    assert job["status"] == "queued" and job["priority"] == 5 and job["attempts"] == 0
    assert job["started_at"] is None and job["finished_at"] is None
    assert job["error"] is None and job["outputs"] is None
    assert ISO_UTC.match(job["created_at"]), job["created_at"]
    created = datetime.fromisoformat(job["created_at"].replace("Z", "+00:00"))
    assert abs(datetime.now(UTC) - created) < timedelta(minutes=1)

    row = read_job(sessions, job["id"])
    assert row.status == JobStatus.QUEUED and row.samples == 1 and row.priority == 5
    np.testing.assert_array_equal(stored_inputs(sessions, job["id"])["x"], [ROW])
    assert stored_inputs(sessions, job["id"])["x"].dtype == np.float32


async def test_submit_publishes_the_job_id_after_its_row_is_committed(
    publications: list[Publication], client: httpx.AsyncClient, broker: redis.Redis
) -> None:
    response = await client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": [ROW]}})

    assert response.status_code == 202
    job_id = response.json()["id"]
    assert publications == [Publication("mlp", 2, [job_id], committed=True)]
    (message,) = queued_messages(broker, "tffleet.mlp")
    assert message["headers"]["task"] == "tffleet.run_batch"
    assert task_args(message) == ["mlp", 2, [job_id]]


async def test_each_model_has_its_own_queue(client: httpx.AsyncClient, broker: redis.Redis) -> None:
    first = (await client.post("/v1/jobs", json={"model": "mlp", "inputs": [ROW]})).json()
    second = (await client.post("/v1/jobs", json={"model": "count", "inputs": [[1, 2]]})).json()

    assert [task_args(m) for m in queued_messages(broker, "tffleet.mlp")] == [
        ["mlp", 2, [first["id"]]]
    ]
    assert [task_args(m) for m in queued_messages(broker, "tffleet.count")] == [
        ["count", 1, [second["id"]]]
    ]


async def test_a_bare_tensor_is_the_single_input(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    response = await client.post("/v1/jobs", json={"model": "mlp", "inputs": [ROW, ROW]})

    assert response.status_code == 202
    stored = stored_inputs(sessions, response.json()["id"])
    assert list(stored) == ["x"]
    np.testing.assert_array_equal(stored["x"], [ROW, ROW])
    assert read_job(sessions, response.json()["id"]).samples == 2


@pytest.mark.parametrize("bare", [False, True], ids=["named", "bare"])
async def test_a_b64_envelope_is_accepted(
    client: httpx.AsyncClient, sessions: Sessions, bare: bool
) -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    tensor = envelope(array)

    response = await client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": tensor if bare else {"x": tensor}}
    )

    assert response.status_code == 202
    np.testing.assert_array_equal(stored_inputs(sessions, response.json()["id"])["x"], array)


async def test_two_input_model_takes_inputs_by_name(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    a = np.ones((2, 3), dtype=np.float32)
    response = await client.post(
        "/v1/jobs",
        json={"model": "pair", "inputs": {"a": envelope(a), "b": [[1, 2], [3, 4]]}},
    )

    assert response.status_code == 202
    stored = stored_inputs(sessions, response.json()["id"])
    assert sorted(stored) == ["a", "b"]
    np.testing.assert_array_equal(stored["b"], [[1, 2], [3, 4]])


async def test_int32_model_stores_int32(client: httpx.AsyncClient, sessions: Sessions) -> None:
    response = await client.post("/v1/jobs", json={"model": "count", "inputs": [[1, -2, 3]]})

    assert response.status_code == 202
    stored = stored_inputs(sessions, response.json()["id"])["ids"]
    assert stored.dtype == np.int32
    np.testing.assert_array_equal(stored, [[1, -2, 3]])


async def test_version_defaults_to_the_latest_registered(client: httpx.AsyncClient) -> None:
    latest = await client.post("/v1/jobs", json={"model": "mlp", "inputs": [ROW]})
    pinned = await client.post("/v1/jobs", json={"model": "mlp", "version": 1, "inputs": [ROW]})

    assert latest.json()["version"] == 2
    assert pinned.json()["version"] == 1


async def test_a_json_content_type_with_charset_is_json(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/jobs",
        content=b'{"model": "mlp", "inputs": [[1, 2, 3, 4]]}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert response.status_code == 202


async def test_a_submit_with_the_broker_down_is_still_accepted_and_stays_queued(
    open_api: OpenApi, sessions: Sessions, broker: redis.Redis
) -> None:
    async with open_api(broker_url=DEAD_BROKER_URL) as api:
        response = await api.client.post("/v1/jobs", json={"model": "mlp", "inputs": [ROW]})
        assert response.status_code == 202
        job_id = response.json()["id"]
        polled = await api.client.get(f"/v1/jobs/{job_id}")

    # Durable: the row is there for the sweeper to publish once the broker is back.
    assert polled.json()["status"] == "queued"
    assert read_job(sessions, job_id).status == JobStatus.QUEUED
    assert count_jobs(sessions) == 1
    assert queued_messages(broker, "tffleet.mlp") == []
    with sessions() as session:
        stale = jobs.stale_queued(
            session=session, older_than=datetime.now(UTC) + timedelta(seconds=1), limit=10
        )
    assert stale == {("mlp", 2): [job_id]}


@pytest.mark.both_databases
async def test_concurrent_submissions_are_each_stored_and_published_once(
    publications: list[Publication],
    client: httpx.AsyncClient,
    sessions: Sessions,
    broker: redis.Redis,
) -> None:
    bodies = [{"model": "mlp", "inputs": [[float(i), 0.0, 0.0, 0.0]]} for i in range(20)]

    responses = await asyncio.gather(*(client.post("/v1/jobs", json=b) for b in bodies))

    assert [r.status_code for r in responses] == [202] * 20
    ids = [r.json()["id"] for r in responses]
    assert len(set(ids)) == 20 and count_jobs(sessions) == 20
    for i, job_id in enumerate(ids):  # each answer names its own request's job
        assert stored_inputs(sessions, job_id)["x"][0, 0] == i
    assert all(p.committed for p in publications)
    assert sorted(i for p in publications for i in p.job_ids) == sorted(ids)
    # No worker takes the first wake-up, so the later ones are left out: it wakes them all
    # (but where the API stored more than ONCE_MAX_JOBS in one commit: that one is pushed).
    messages = queued_messages(broker, "tffleet.mlp")
    big = [p for p in publications if len(p.job_ids) > ONCE_MAX_JOBS]
    assert 1 <= len(messages) <= 1 + len(big)
    assert {i for m in messages for i in task_args(m)[2]} <= set(ids)


# Many jobs in one request (an extension of the contract)


@pytest.mark.both_databases
async def test_a_batch_of_jobs_is_stored_and_published_together(
    publications: list[Publication], client: httpx.AsyncClient, broker: redis.Redis
) -> None:
    body = {
        "jobs": [
            {"model": "mlp", "inputs": [ROW]},
            {"model": "mlp", "version": 1, "inputs": [ROW, ROW]},
            {"model": "mlp", "inputs": {"x": [ROW]}, "priority": 9},
        ]
    }

    response = await client.post("/v1/jobs", json=body)

    assert response.status_code == 202
    out = response.json()["jobs"]
    assert [(j["version"], j["priority"], j["status"]) for j in out] == [
        (2, 0, "queued"),
        (1, 0, "queued"),
        (2, 9, "queued"),
    ]
    assert all(p.committed for p in publications)
    published = sorted(
        (args[1], args[2]) for args in map(task_args, queued_messages(broker, "tffleet.mlp"))
    )
    assert published == [(1, [out[1]["id"]]), (2, [out[0]["id"], out[2]["id"]])]


async def test_a_batch_with_one_bad_job_stores_none(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    body = {"jobs": [{"model": "mlp", "inputs": [ROW]}, {"model": "mlp", "inputs": [[1, 2]]}]}

    response = await client.post("/v1/jobs", json=body)

    assert response.status_code == 422
    assert "jobs[1]" in response.json()["error"]["message"]
    assert "inputs.x" in response.json()["error"]["message"]
    assert_nothing_left(sessions, broker)


# Refused: 422 (the inputs do not fit the signature, or the body's fields are wrong)

NAN = np.array([[1.0, np.nan, 3.0, 4.0]], dtype=np.float32)
INF = np.array([[1.0, 2.0, -np.inf, 4.0]], dtype=np.float32)

INVALID: list[tuple[str, dict[str, Any], list[str]]] = [
    ("missing_input", {"model": "pair", "inputs": {"a": [[1, 2, 3]]}}, ["inputs", "'b'"]),
    (
        "unknown_input",
        {"model": "mlp", "inputs": {"x": [ROW], "z": [[1.0]]}},
        ["inputs", "'z'"],
    ),
    ("wrong_rank", {"model": "mlp", "inputs": {"x": ROW}}, ["inputs.x", "rank"]),
    ("wrong_dim", {"model": "mlp", "inputs": {"x": [[1, 2, 3]]}}, ["inputs.x", "dimension 1"]),
    ("ragged", {"model": "mlp", "inputs": {"x": [ROW, [1, 2]]}}, ["inputs.x", "ragged"]),
    ("strings", {"model": "mlp", "inputs": {"x": [["a", "b", "c", "d"]]}}, ["inputs.x"]),
    ("bools_for_floats", {"model": "mlp", "inputs": [[True, False, True, False]]}, ["inputs.x"]),
    ("nan_in_b64", {"model": "mlp", "inputs": {"x": envelope(NAN)}}, ["inputs.x", "NaN"]),
    ("inf_in_b64", {"model": "mlp", "inputs": {"x": envelope(INF)}}, ["inputs.x", "infinity"]),
    (
        "empty_batch_b64",
        {"model": "mlp", "inputs": {"x": envelope(np.zeros((0, 4), np.float32))}},
        ["inputs.x", "empty"],
    ),
    ("empty_batch_lists", {"model": "mlp", "inputs": {"x": []}}, ["inputs.x", "empty"]),
    (
        "mismatched_batch",
        {"model": "pair", "inputs": {"a": [[1, 2, 3], [4, 5, 6]], "b": [[1, 2]]}},
        ["inputs.b", "batch size"],
    ),
    (
        "wrong_dtype_in_envelope",
        {"model": "mlp", "inputs": {"x": envelope(np.ones((1, 4), np.int32))}},
        ["inputs.x", "dtype"],
    ),
    (
        "bad_base64",
        {"model": "mlp", "inputs": {"x": envelope(np.ones((1, 4), np.float32), b64="!!!=")}},
        ["inputs.x", "base64"],
    ),
    (
        "envelope_bytes_do_not_match_shape",
        {"model": "mlp", "inputs": {"x": envelope(np.ones((1, 4), np.float32), shape=[2, 4])}},
        ["inputs.x", "bytes"],
    ),
    ("floats_for_int32", {"model": "count", "inputs": [[1.5, 2.0]]}, ["inputs.ids"]),
    ("int32_overflow", {"model": "count", "inputs": [[2**31]]}, ["inputs.ids", "range"]),
    ("bare_tensor_for_two_inputs", {"model": "pair", "inputs": [[1, 2, 3]]}, ["inputs"]),
    ("scalar_input", {"model": "mlp", "inputs": {"x": 3}}, ["inputs.x"]),
    ("extra_top_level_field", {"model": "mlp", "inputs": [ROW], "colour": "red"}, ["colour"]),
    ("priority_too_high", {"model": "mlp", "inputs": [ROW], "priority": 5000}, ["priority"]),
    ("priority_too_low", {"model": "mlp", "inputs": [ROW], "priority": -5000}, ["priority"]),
    ("version_zero", {"model": "mlp", "version": 0, "inputs": [ROW]}, ["version"]),
    ("no_model", {"inputs": [ROW]}, ["model"]),
    ("no_inputs", {"model": "mlp"}, ["inputs"]),
    ("bad_model_name", {"model": "../mlp", "inputs": [ROW]}, ["model"]),
]


@pytest.mark.parametrize(
    ("body", "named"), [(b, n) for _, b, n in INVALID], ids=[i for i, _, _ in INVALID]
)
async def test_inputs_that_do_not_fit_are_422_naming_the_field(
    client: httpx.AsyncClient,
    sessions: Sessions,
    broker: redis.Redis,
    body: dict[str, Any],
    named: list[str],
) -> None:
    response = await client.post("/v1/jobs", json=body)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    for part in named:
        assert part in error["message"], error["message"]
    assert_nothing_left(sessions, broker)


# Refused: 404, 400, 415, 413


async def test_unknown_model_is_404_naming_it(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    response = await client.post("/v1/jobs", json={"model": "nosuch", "inputs": [ROW]})

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    message = response.json()["error"]["message"]
    assert message.startswith("model: no model named 'nosuch' is registered; models: ")
    assert_nothing_left(sessions, broker)


async def test_unknown_version_is_404_naming_it(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    response = await client.post("/v1/jobs", json={"model": "mlp", "version": 7, "inputs": [ROW]})

    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert "version" in message and "7" in message and "mlp" in message
    assert_nothing_left(sessions, broker)


@pytest.mark.parametrize(
    "body",
    [b'{"model": "mlp", "inputs": [[1, 2, 3, 4]]', b"", b'{"model": "mlp", "inputs": [[NaN]]}'],
    ids=["truncated", "empty", "nan_literal"],
)
async def test_malformed_json_is_400(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis, body: bytes
) -> None:
    response = await client.post(
        "/v1/jobs", content=body, headers={"content-type": "application/json"}
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_request"
    assert_nothing_left(sessions, broker)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_that_is_not_json_is_415(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = await client.post(
        "/v1/jobs", content=b'{"model": "mlp", "inputs": [[1, 2, 3, 4]]}', headers=headers
    )

    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert_nothing_left(sessions, broker)


def _big_body() -> bytes:
    rows = ", ".join("[1.0, 2.0, 3.0, 4.0]" for _ in range(MAX_BODY_BYTES // 20 + 1))
    body = f'{{"model": "mlp", "inputs": [{rows}]}}'.encode()
    assert len(body) > MAX_BODY_BYTES
    return body


async def test_a_body_over_the_limit_is_413(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    response = await client.post(
        "/v1/jobs", content=_big_body(), headers={"content-type": "application/json"}
    )

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert str(MAX_BODY_BYTES) in response.json()["error"]["message"]
    assert_nothing_left(sessions, broker)


async def test_a_streamed_body_over_the_limit_is_413(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    body = _big_body()

    async def chunks() -> Any:  # no Content-Length: the limit is enforced while reading
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    response = await client.post(
        "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )

    assert response.status_code == 413
    assert_nothing_left(sessions, broker)


async def test_a_body_just_under_the_limit_is_accepted(client: httpx.AsyncClient) -> None:
    rows = ", ".join("[1, 2, 3, 4]" for _ in range(MAX_BODY_BYTES // 14 - 10))
    body = f'{{"model": "mlp", "inputs": [{rows}]}}'.encode()
    assert len(body) <= MAX_BODY_BYTES

    response = await client.post(
        "/v1/jobs", content=body, headers={"content-type": "application/json"}
    )

    assert response.status_code == 202


async def test_a_job_may_ask_for_its_own_retention(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    response = await client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": [ROW]}, "ttl_s": 3600}
    )
    assert response.status_code == 202
    assert read_job(sessions, response.json()["id"]).ttl_s == 3600


@pytest.mark.parametrize("ttl_s", [0, -5, 10**9, "soon"])
async def test_a_retention_out_of_range_is_422_naming_ttl_s(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis, ttl_s: Any
) -> None:
    response = await client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": [ROW]}, "ttl_s": ttl_s}
    )
    assert response.status_code == 422
    assert "ttl_s" in response.json()["error"]["message"]
    assert_nothing_left(sessions, broker)


def test_a_transaction_takes_many_small_submissions_but_only_one_large_one() -> None:
    def request(count: int, nbytes: int) -> ingest.Submission:
        job = jobs.NewJob(model="m", version=1, samples=1, inputs=b"\0" * nbytes)
        return ingest.Submission([job] * count)

    small, large = request(256, 4096), request(1, 12 * 2**20)  # a CNN job of 256 images

    assert ingest._units(small) == 256  # eight such requests share one commit
    assert ingest._units(large) > ingest._MAX_UNITS // 2  # two never do
