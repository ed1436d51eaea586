"""`Cancel-After` on POST /v1/jobs, POST /v1/jobs/{id}/retry and DELETE /v1/jobs/{id}."""

from __future__ import annotations

import time
from datetime import datetime

import httpx
import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import JobErrorCode, JobStatus
from tests.api.conftest import ISO_UTC, Api, Publication, finish_job, read_job

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

X = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
OUTPUTS = {"y": np.zeros((1, 2), dtype=np.float32)}
MISSING = "01890000-0000-7000-8000-000000000000"


async def submit(client: httpx.AsyncClient, **headers: str) -> dict[str, object]:
    response = await client.post("/v1/jobs", json=X, headers=headers)
    assert response.status_code == 202, response.text
    job: dict[str, object] = response.json()
    return job


def seconds_between(job: dict[str, object], start: str, end: str) -> float:
    parse = lambda v: datetime.fromisoformat(str(v).replace("Z", "+00:00"))  # noqa: E731
    return (parse(job[end]) - parse(job[start])).total_seconds()


def fail(sessions: Sessions, job_id: str) -> None:
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
        jobs.fail(session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="boom")


# Cancel-After


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("30", 30), ("1.5", 1.5), ("90s", 90), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25)],
)
async def test_cancel_after_sets_the_jobs_deadline(
    client: httpx.AsyncClient, header: str, seconds: float
) -> None:
    job = await submit(client, **{"Cancel-After": header})

    assert ISO_UTC.match(str(job["deadline_at"]))
    assert seconds_between(job, "created_at", "deadline_at") == pytest.approx(seconds)


async def test_a_job_without_cancel_after_has_no_deadline(client: httpx.AsyncClient) -> None:
    job = await submit(client)

    assert job["deadline_at"] is None
    assert (await client.get(f"/v1/jobs/{job['id']}")).json()["deadline_at"] is None


@pytest.mark.parametrize(
    "header", ["", "soon", "-5", "0", "0s", "1d", "5 m", "1e3", "nan", "1h-5m"]
)
async def test_a_bad_cancel_after_is_422_naming_the_header_and_stores_nothing(
    client: httpx.AsyncClient, sessions: Sessions, header: str
) -> None:
    response = await client.post("/v1/jobs", json=X, headers={"Cancel-After": header})

    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"].startswith("Cancel-After:")
    with sessions() as session:
        assert jobs.count_queued(session=session) == 0


async def test_cancel_after_applies_to_each_job_of_a_bulk_submit(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/jobs", json={"jobs": [X, X, X]}, headers={"Cancel-After": "2m"}
    )

    assert response.status_code == 202
    for job in response.json()["jobs"]:
        assert seconds_between(job, "created_at", "deadline_at") == pytest.approx(120)


async def test_a_job_past_its_deadline_is_canceled_by_the_claim_with_error_deadline(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job = await submit(client, **{"Cancel-After": "10ms"})
    time.sleep(0.05)
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[str(job["id"])], owner="w", lease_s=60)

    polled = (await client.get(f"/v1/jobs/{job['id']}")).json()
    assert leases == []
    assert polled["status"] == "canceled"
    assert polled["error"]["code"] == "deadline"


async def test_the_same_idempotency_key_with_another_cancel_after_is_409(
    client: httpx.AsyncClient,
) -> None:
    first = await client.post(
        "/v1/jobs", json=X, headers={"Idempotency-Key": "k1", "Cancel-After": "30"}
    )
    again = await client.post(
        "/v1/jobs", json=X, headers={"Idempotency-Key": "k1", "Cancel-After": "30"}
    )
    other = await client.post(
        "/v1/jobs", json=X, headers={"Idempotency-Key": "k1", "Cancel-After": "60"}
    )

    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 409


# Retry


@pytest.mark.parametrize("end", ["failed", "canceled"])
async def test_retry_of_a_failed_or_canceled_job_queues_it_again_and_wakes_a_worker(
    client: httpx.AsyncClient, sessions: Sessions, publications: list[Publication], end: str
) -> None:
    job_id = str((await submit(client))["id"])
    if end == "failed":
        fail(sessions, job_id)
    else:
        await client.post(f"/v1/jobs/{job_id}/cancel")
    published = len(publications)

    response = await client.post(f"/v1/jobs/{job_id}/retry")

    assert response.status_code == 200, response.text
    job = response.json()
    assert job["id"] == job_id and job["status"] == "queued"
    assert job["error"] is None and job["finished_at"] is None and job["outputs"] is None
    assert job["attempts"] == (1 if end == "failed" else 0)
    assert job["queue_position"] == 0  # where it stands, as a submit's answer says
    assert [p.job_ids for p in publications[published:]] == [[job_id]]
    assert publications[-1].committed
    finish_job(sessions, job_id, OUTPUTS)
    done = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert done["status"] == "succeeded" and done["outputs"] is not None


async def test_retry_takes_a_new_cancel_after(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = str((await submit(client, **{"Cancel-After": "1ms"}))["id"])
    time.sleep(0.02)
    with sessions.begin() as session:
        assert jobs.cancel_overdue(session=session) == [job_id]

    plain = (await client.post(f"/v1/jobs/{job_id}/retry")).json()
    await client.post(f"/v1/jobs/{job_id}/cancel")
    timed = await client.post(f"/v1/jobs/{job_id}/retry", headers={"Cancel-After": "1m"})
    bad = await client.post(f"/v1/jobs/{job_id}/retry", headers={"Cancel-After": "never"})

    assert plain["deadline_at"] is None and plain["error"] is None
    assert timed.status_code == 200
    assert read_job(sessions, job_id).deadline_at is not None
    assert bad.status_code == 422 and "Cancel-After" in bad.json()["error"]["message"]


@pytest.mark.parametrize("status", ["queued", "running", "succeeded"])
async def test_retry_of_a_queued_running_or_succeeded_job_is_409_naming_its_status(
    client: httpx.AsyncClient, sessions: Sessions, status: str
) -> None:
    job_id = str((await submit(client))["id"])
    if status == "running":
        with sessions.begin() as session:
            jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
    elif status == "succeeded":
        finish_job(sessions, job_id, OUTPUTS)

    response = await client.post(f"/v1/jobs/{job_id}/retry")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_retryable"
    assert f"is {status}" in response.json()["error"]["message"]
    assert read_job(sessions, job_id).status == status


async def test_retry_and_delete_of_an_unknown_job_are_404(client: httpx.AsyncClient) -> None:
    for response in (
        await client.post(f"/v1/jobs/{MISSING}/retry"),
        await client.delete(f"/v1/jobs/{MISSING}"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "job_not_found"


async def test_another_tenants_job_cannot_be_retried_or_deleted_an_admin_can(
    api: Api, sessions: Sessions
) -> None:
    acme, globex = api.key("acme"), api.key("globex")
    job_id = str((await submit(api.client, **acme))["id"])
    await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=acme)

    retried = await api.client.post(f"/v1/jobs/{job_id}/retry", headers=globex)
    deleted = await api.client.delete(f"/v1/jobs/{job_id}", headers=globex)

    assert retried.status_code == deleted.status_code == 404
    assert read_job(sessions, job_id).status == JobStatus.CANCELED
    mine = await api.client.post(f"/v1/jobs/{job_id}/retry", headers=acme)
    assert mine.status_code == 200 and mine.json()["worker"] is None
    await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=acme)
    assert (await api.client.delete(f"/v1/jobs/{job_id}")).status_code == 204  # the admin's


async def test_retry_and_delete_take_a_key(api: Api) -> None:
    del api.client.headers["Authorization"]

    for response in (
        await api.client.post(f"/v1/jobs/{MISSING}/retry"),
        await api.client.delete(f"/v1/jobs/{MISSING}"),
    ):
        assert response.status_code == 401


# Delete


@pytest.mark.parametrize("end", ["succeeded", "failed", "canceled"])
async def test_delete_of_an_ended_job_is_204_and_it_is_gone(
    client: httpx.AsyncClient, sessions: Sessions, end: str
) -> None:
    job_id = str((await submit(client))["id"])
    if end == "succeeded":
        finish_job(sessions, job_id, OUTPUTS)
    elif end == "failed":
        fail(sessions, job_id)
    else:
        await client.post(f"/v1/jobs/{job_id}/cancel")

    response = await client.delete(f"/v1/jobs/{job_id}")

    assert response.status_code == 204 and response.content == b""
    assert (await client.get(f"/v1/jobs/{job_id}")).status_code == 404
    assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 404
    assert (await client.get("/v1/jobs")).json()["jobs"] == []


@pytest.mark.parametrize("status", ["queued", "running"])
async def test_delete_of_a_queued_or_running_job_is_409_until_it_is_canceled(
    client: httpx.AsyncClient, sessions: Sessions, status: str
) -> None:
    job_id = str((await submit(client))["id"])
    if status == "running":
        with sessions.begin() as session:
            jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)

    refused = await client.delete(f"/v1/jobs/{job_id}")
    await client.post(f"/v1/jobs/{job_id}/cancel")
    deleted = await client.delete(f"/v1/jobs/{job_id}")

    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "job_not_ended"
    assert f"is {status}" in refused.json()["error"]["message"]
    assert "cancel it first" in refused.json()["error"]["message"]
    assert deleted.status_code == 204


@pytest.mark.both_databases
async def test_a_deleted_jobs_idempotency_key_makes_a_new_job(client: httpx.AsyncClient) -> None:
    first = (await submit(client, **{"Idempotency-Key": "k2"}))["id"]
    await client.post(f"/v1/jobs/{first}/cancel")
    await client.delete(f"/v1/jobs/{first}")

    again = await submit(client, **{"Idempotency-Key": "k2"})

    assert again["id"] != first and again["status"] == "queued"
