"""429 while the queue holds TFFLEET_MAX_QUEUED_JOBS jobs; the count is cached for a moment."""

from __future__ import annotations

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from api import admission
from db import jobs
from tests.api.conftest import OpenApi, count_jobs, queued_messages

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

ONE = {"model": "mlp", "inputs": [[1, 2, 3, 4]]}


async def test_a_submit_past_the_limit_is_429_and_stores_nothing(
    open_api: OpenApi, sessions: Sessions, broker: redis.Redis
) -> None:
    async with open_api(max_queued_jobs=3, tenant_max_queued_jobs=0) as api:
        accepted = [await api.client.post("/v1/jobs", json=ONE) for _ in range(3)]
        refused = await api.client.post("/v1/jobs", json=ONE)

    assert [r.status_code for r in accepted] == [202] * 3
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "queue_full"
    assert "TFFLEET_MAX_QUEUED_JOBS=3" in error["message"]
    assert count_jobs(sessions) == 3
    # One wake-up waits for the three (no worker took it); the refused submit added none.
    assert len(queued_messages(broker, "tffleet.mlp")) == 1


async def test_a_bulk_submit_that_would_overflow_is_refused_whole(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(max_queued_jobs=3, tenant_max_queued_jobs=0) as api:
        await api.client.post("/v1/jobs", json=ONE)
        too_many = await api.client.post("/v1/jobs", json={"jobs": [ONE] * 3})
        fits = await api.client.post("/v1/jobs", json={"jobs": [ONE] * 2})

    assert too_many.status_code == 429
    assert fits.status_code == 202
    assert count_jobs(sessions) == 3


async def test_room_frees_up_once_workers_take_jobs_from_the_queue(
    open_api: OpenApi, sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "COUNT_TTL_S", 0.0)  # count on every submit
    async with open_api(max_queued_jobs=2, tenant_max_queued_jobs=0) as api:
        ids = [(await api.client.post("/v1/jobs", json=ONE)).json()["id"] for _ in range(2)]
        full = await api.client.post("/v1/jobs", json=ONE)
        with sessions.begin() as session:  # a worker claims one: running jobs do not count
            jobs.claim(session=session, job_ids=ids[:1], owner="test-worker", lease_s=60)
        again = await api.client.post("/v1/jobs", json=ONE)

    assert full.status_code == 429
    assert again.status_code == 202
    assert count_jobs(sessions) == 3


async def test_the_count_is_cached_so_a_burst_costs_one_query(
    open_api: OpenApi, sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts: list[int] = []
    count_queued = jobs.count_queued

    def counting(*, session: Session, tenant: str | None = None) -> int:
        counts.append(count_queued(session=session, tenant=tenant))
        return counts[-1]

    monkeypatch.setattr(jobs, "count_queued", counting)
    monkeypatch.setattr(admission, "COUNT_TTL_S", 60.0)
    async with open_api(max_queued_jobs=5, tenant_max_queued_jobs=0) as api:
        codes = [(await api.client.post("/v1/jobs", json=ONE)).status_code for _ in range(7)]

    # Counted once; the jobs admitted since are added up, so the limit holds between counts.
    assert counts == [0]
    assert codes == [202] * 5 + [429] * 2
    assert count_jobs(sessions) == 5


async def test_without_a_limit_the_queue_is_never_counted(
    open_api: OpenApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*, session: Session, tenant: str | None = None) -> int:
        raise AssertionError("counted the queue without a limit")

    monkeypatch.setattr(jobs, "count_queued", refuse)
    async with open_api(tenant_max_queued_jobs=0) as api:
        response = await api.client.post("/v1/jobs", json={"jobs": [ONE] * 50})

    assert response.status_code == 202
