"""A queued job's `queue_position` and `eta_s` on every read and on submit; null once it runs."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from tests.api.conftest import Api, finish_job

pytestmark = [pytest.mark.anyio, pytest.mark.both_databases]

Sessions = sessionmaker[Session]

ROW = [1.0, 2.0, 3.0, 4.0]


@pytest.fixture
def fresh(api: Api) -> Api:
    """The app reading job sizes and the recent pace on every read, not every few seconds."""
    api.state.reader.recent.refresh_s = 0
    api.state.ingestor.recent.refresh_s = 0
    return api


async def submit(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json={"model": "mlp", "inputs": [ROW], **body})
    assert response.status_code == 202, response.text
    job: dict[str, Any] = response.json()
    return job


async def read(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    return job


def claim_one(sessions: Sessions) -> str:
    """Claim the next job of mlp:2 (the latest) as a worker would, one sample's room."""
    with sessions.begin() as session:
        (lease,) = jobs.claim_next(
            session=session, model="mlp", version=2, owner="w", lease_s=60, max_samples=1
        )
    return lease.job_id


async def test_a_submitted_job_shows_how_many_go_before_it(fresh: Api) -> None:
    first = await submit(fresh.client)
    second = await submit(fresh.client)

    assert (first["queue_position"], second["queue_position"]) == (0, 1)
    # Nothing of mlp:2 finished lately: no pace to go by.
    assert first["eta_s"] is None and second["eta_s"] is None
    assert await read(fresh.client, second["id"]) == second


async def test_the_position_counts_down_as_the_jobs_ahead_are_claimed(
    fresh: Api, sessions: Sessions
) -> None:
    ids = [(await submit(fresh.client))["id"] for _ in range(3)]
    last = ids[-1]

    seen = [(await read(fresh.client, last))["queue_position"]]
    for _ in range(2):
        claim_one(sessions)
        seen.append((await read(fresh.client, last))["queue_position"])
    assert claim_one(sessions) == last
    running = await read(fresh.client, last)

    assert seen == [2, 1, 0]
    assert running["status"] == "running"
    assert running["queue_position"] is None and running["eta_s"] is None


async def test_a_higher_priority_goes_first_and_another_tenant_takes_turns(
    fresh: Api, sessions: Sessions
) -> None:
    a = [(await submit(fresh.client))["id"] for _ in range(2)]
    b = await fresh.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": [ROW]}, headers=fresh.key("other")
    )
    urgent = await submit(fresh.client, priority=5)

    positions = {job_id: (await read(fresh.client, job_id))["queue_position"] for job_id in a}
    with sessions.begin() as session:
        leases = jobs.claim_next(
            session=session, model="mlp", version=2, owner="w", lease_s=60, max_samples=10
        )

    # The tenants take turns, the older of their next jobs first (b's, then the urgent one);
    # then the default tenant's by age.
    assert [lease.job_id for lease in leases] == [b.json()["id"], urgent["id"], *a]
    assert b.json()["queue_position"] == 1  # a[0] was the default tenant's next when it came
    assert urgent["queue_position"] == 1
    assert positions == {a[0]: 2, a[1]: 3}


async def test_the_eta_follows_the_recent_pace(fresh: Api, sessions: Sessions) -> None:
    done = await submit(fresh.client)
    finish_job(sessions, done["id"], {"y": np.zeros((1, 2), np.float32)})

    queued = [await submit(fresh.client) for _ in range(3)]

    etas = [job["eta_s"] for job in queued]
    assert all(eta is not None and eta > 0 for eta in etas)
    assert etas[0] < etas[1] < etas[2]
    assert (await read(fresh.client, done["id"]))["eta_s"] is None


async def test_reads_of_many_jobs_place_each_as_a_read_of_one_does(fresh: Api) -> None:
    other = fresh.key("other")
    ids = []
    for priority in (0, 2, 0, 1, 0, 2):
        ids.append((await submit(fresh.client, priority=priority))["id"])
        response = await fresh.client.post(
            "/v1/jobs", json={"model": "mlp", "inputs": [ROW]}, headers=other
        )
        ids.append(response.json()["id"])

    one_by_one = {job_id: (await read(fresh.client, job_id))["queue_position"] for job_id in ids}
    many = (await fresh.client.post("/v1/jobs/status", json={"ids": ids})).json()["jobs"]
    listed = (await fresh.client.get("/v1/jobs?status=queued")).json()["jobs"]

    assert {job["id"]: job["queue_position"] for job in many} == one_by_one
    assert {job["id"]: job["queue_position"] for job in listed} == one_by_one


async def test_a_bulk_submit_places_every_job(fresh: Api) -> None:
    body = {"jobs": [{"model": "mlp", "inputs": [ROW]} for _ in range(12)]}

    response = await fresh.client.post("/v1/jobs", json=body)

    assert [job["queue_position"] for job in response.json()["jobs"]] == list(range(12))


async def test_a_long_poll_that_ends_with_the_job_still_queued_says_where_it_stands(
    fresh: Api,
) -> None:
    """The reads while a poll waits place nothing (a walk of the queue each); its answer does."""
    first, second = await submit(fresh.client), await submit(fresh.client)

    held = await fresh.client.get(f"/v1/jobs/{second['id']}", params={"wait": "0.3"})
    many = await fresh.client.post(
        "/v1/jobs/status", json={"ids": [first["id"], second["id"]], "wait": 0.3, "until": "all"}
    )

    assert held.json()["queue_position"] == 1
    assert [job["queue_position"] for job in many.json()["jobs"]] == [0, 1]
