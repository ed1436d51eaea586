"""`Queue-Timeout` on POST /v1/jobs (one job, bulk, binary) and POST /v1/jobs/{id}/retry: a job
no worker started by then ends `canceled` with error `queue_timeout`, without running."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import httpx
import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.views import iso_utc
from tests.api.conftest import read_job

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

X = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}


async def submit(client: httpx.AsyncClient, **headers: str) -> str:
    response = await client.post("/v1/jobs", json=X, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def queue_timeout_s(sessions: Sessions, job_id: str) -> float | None:
    """Seconds from the job's creation to its queue time-out, as stored; None without one."""
    job = read_job(sessions, job_id)
    if job.queue_timeout_at is None:
        return None
    return (job.queue_timeout_at - job.created_at) / timedelta(seconds=1)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("30", 30), ("1.5", 1.5), ("90s", 90), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25)],
)
async def test_queue_timeout_sets_when_an_unstarted_job_is_canceled(
    client: httpx.AsyncClient, sessions: Sessions, header: str, seconds: float
) -> None:
    job_id = await submit(client, **{"Queue-Timeout": header})

    assert queue_timeout_s(sessions, job_id) == pytest.approx(seconds)
    assert read_job(sessions, job_id).deadline_at is None  # not a deadline
    shown = (await client.get(f"/v1/jobs/{job_id}")).json()
    stored = read_job(sessions, job_id).queue_timeout_at
    assert stored is not None and shown["deadline_at"] is None
    assert shown["queue_timeout_at"] == iso_utc(stored) and shown["queue_timeout_at"].endswith("Z")


async def test_a_job_without_queue_timeout_has_none(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = await submit(client)
    assert queue_timeout_s(sessions, job_id) is None
    assert (await client.get(f"/v1/jobs/{job_id}")).json()["queue_timeout_at"] is None


@pytest.mark.parametrize(
    "header", ["", "soon", "-5", "0", "0s", "1d", "5 m", "1e3", "nan", "1h-5m", "9999999999"]
)
async def test_a_bad_queue_timeout_is_422_naming_the_header_and_stores_nothing(
    client: httpx.AsyncClient, sessions: Sessions, header: str
) -> None:
    response = await client.post("/v1/jobs", json=X, headers={"Queue-Timeout": header})

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_input"
    assert response.json()["error"]["message"].startswith("Queue-Timeout:")
    with sessions() as session:
        assert jobs.count_queued(session=session) == 0


async def test_queue_timeout_applies_to_each_job_of_a_bulk_submit(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    response = await client.post(
        "/v1/jobs", json={"jobs": [X, X, X]}, headers={"Queue-Timeout": "2m"}
    )

    assert response.status_code == 202, response.text
    for job in response.json()["jobs"]:
        assert queue_timeout_s(sessions, job["id"]) == pytest.approx(120)


async def test_queue_timeout_applies_to_a_binary_submit(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    body = io.BytesIO()
    np.savez(body, x=np.ones((2, 4), np.float32))
    response = await client.post(
        "/v1/jobs?model=mlp",
        content=body.getvalue(),
        headers={"Content-Type": "application/x-npz", "Queue-Timeout": "45"},
    )

    assert response.status_code == 202, response.text
    assert queue_timeout_s(sessions, response.json()["id"]) == pytest.approx(45)


async def test_a_job_not_started_by_its_queue_timeout_ends_canceled_without_running(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = await submit(client, **{"Queue-Timeout": "10ms", "Cancel-After": "1h"})
    time.sleep(0.05)
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)

    polled = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert leases == []
    assert polled["status"] == "canceled" and polled["outputs"] is None
    assert polled["error"]["code"] == "queue_timeout"
    assert polled["attempts"] == 0 and polled["started_at"] is None


async def test_the_same_idempotency_key_with_another_queue_timeout_is_409(
    client: httpx.AsyncClient,
) -> None:
    first = await client.post(
        "/v1/jobs", json=X, headers={"Idempotency-Key": "q1", "Queue-Timeout": "30"}
    )
    again = await client.post(
        "/v1/jobs", json=X, headers={"Idempotency-Key": "q1", "Queue-Timeout": "30"}
    )
    other = await client.post(
        "/v1/jobs", json=X, headers={"Idempotency-Key": "q1", "Queue-Timeout": "60"}
    )
    none = await client.post("/v1/jobs", json=X, headers={"Idempotency-Key": "q1"})

    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == none.status_code == 409


async def test_retry_takes_a_new_queue_timeout(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = await submit(client, **{"Queue-Timeout": "1ms"})
    time.sleep(0.02)
    with sessions.begin() as session:
        assert jobs.cancel_unstarted(session=session) == [job_id]

    bad = await client.post(f"/v1/jobs/{job_id}/retry", headers={"Queue-Timeout": "never"})
    timed = await client.post(f"/v1/jobs/{job_id}/retry", headers={"Queue-Timeout": "1m"})
    job = read_job(sessions, job_id)
    await client.post(f"/v1/jobs/{job_id}/cancel")
    plain = await client.post(f"/v1/jobs/{job_id}/retry")

    assert bad.status_code == 422 and bad.json()["error"]["message"].startswith("Queue-Timeout:")
    assert timed.status_code == 200 and timed.json()["error"] is None
    assert job.queue_timeout_at is not None and job.error_code is None
    assert plain.status_code == 200
    assert read_job(sessions, job_id).queue_timeout_at is None


async def test_the_openapi_schema_declares_the_header_on_submit_and_retry(
    client: httpx.AsyncClient,
) -> None:
    schema = (await client.get("/openapi.json")).json()
    for path in ("/v1/jobs", "/v1/jobs/{job_id}/retry"):
        names = [p["name"] for p in schema["paths"][path]["post"]["parameters"]]
        assert "Queue-Timeout" in names, (path, names)
