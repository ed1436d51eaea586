"""The autoscaling gauges on /metrics: each model's backlog and ready children, from the database.

Jobs and presence rows are written through `db.jobs` and `db.presence`, as the API and the
worker children would; no worker runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, event, update
from sqlalchemy.orm import Session, sessionmaker

from api.autoscaling import AutoscalingCollector
from db import clock, jobs, presence
from db.models import Job, PresenceState
from tests.api.conftest import Api, OpenApi

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]
POLL_S = 5.0  # TFFLEET_MODEL_POLL_S, the default: a presence row is live for 3 polls
GAUGES = (
    "tffleet_jobs_queued",
    "tffleet_jobs_running",
    "tffleet_oldest_queued_age_seconds",
    "tffleet_ready_children",
    "tffleet_backlog_per_child",
    "tffleet_backlog_without_capacity",
    "tffleet_model_stalled_seconds",
)


def samples(text: str) -> dict[str, dict[str, float]]:
    """{sample name: {model: value}} for the samples labelled with a model."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "model" in sample.labels:
                found.setdefault(sample.name, {})[sample.labels["model"]] = sample.value
    return found


async def scrape(api: Api) -> dict[str, dict[str, float]]:
    response = await api.client.get("/metrics")
    assert response.status_code == 200, response.text
    return samples(response.text)


def of(scraped: dict[str, dict[str, float]], model: str) -> dict[str, float]:
    """Every autoscaling gauge of one model."""
    return {name: scraped[name][model] for name in GAUGES}


def add_jobs(sessions: Sessions, count: int, *, model: str = "mlp", version: int = 1) -> list[str]:
    new = [
        jobs.NewJob(model=model, version=version, samples=1, inputs=b"\x00") for _ in range(count)
    ]
    with sessions.begin() as session:
        return [job.id for job in jobs.create(session=session, jobs=new)]


def start(sessions: Sessions, job_ids: list[str]) -> None:
    with sessions.begin() as session:
        claimed = jobs.claim(session=session, job_ids=job_ids, owner="test-child", lease_s=60)
    assert len(claimed) == len(job_ids)


def backdate(sessions: Sessions, job_ids: list[str], *, seconds: float) -> None:
    """As if these jobs had been submitted `seconds` ago (by the database's clock)."""
    with sessions.begin() as session:
        at = clock.now(session) - timedelta(seconds=seconds)
        session.execute(update(Job).where(Job.id.in_(job_ids)).values(created_at=at))


def report(
    sessions: Sessions,
    child: str,
    holds: dict[tuple[str, int], PresenceState],
    *,
    seconds_ago: float = 0.0,
) -> None:
    """A child's presence report, made `seconds_ago` by the database's clock."""
    with sessions.begin() as session:
        now = clock.now(session)
        presence.report(
            session=session,
            child=presence.Child(id=child, host="host-a", pid=1, device="cpu:0"),
            holdings=[
                presence.Holding(
                    name=name, version=version, state=state, path=f"/m/{name}/{version}", since=now
                )
                for (name, version), state in holds.items()
            ],
            now=now - timedelta(seconds=seconds_ago),
        )


LOADED = PresenceState.LOADED


async def test_every_registered_model_is_there_with_zeros_when_idle(api: Api) -> None:
    scraped = await scrape(api)

    for model in ("mlp", "pair", "count"):
        assert of(scraped, model) == dict.fromkeys(GAUGES, 0.0), model


@pytest.mark.both_databases
async def test_queued_and_running_jobs_are_counted_per_model(api: Api, sessions: Sessions) -> None:
    mlp = add_jobs(sessions, 5, model="mlp", version=1) + add_jobs(sessions, 2, version=2)
    start(sessions, mlp[:3])
    add_jobs(sessions, 1, model="pair")
    ended = add_jobs(sessions, 2, model="count")
    start(sessions, ended[:1])
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=ended[0])
        jobs.cancel(session=session, job_id=ended[1])

    scraped = await scrape(api)

    assert scraped["tffleet_jobs_queued"] == {"mlp": 4, "pair": 1, "count": 0}
    assert scraped["tffleet_jobs_running"] == {"mlp": 3, "pair": 0, "count": 0}


async def test_a_model_with_jobs_but_no_registered_version_is_there(
    api: Api, sessions: Sessions
) -> None:
    add_jobs(sessions, 2, model="gone")

    scraped = await scrape(api)

    assert scraped["tffleet_jobs_queued"]["gone"] == 2


@pytest.mark.both_databases
async def test_oldest_queued_age_is_the_oldest_queued_jobs_by_the_database_clock(
    api: Api, sessions: Sessions
) -> None:
    old, newer, running = add_jobs(sessions, 3)
    backdate(sessions, [old], seconds=120)
    backdate(sessions, [newer], seconds=30)
    backdate(sessions, [running], seconds=600)
    start(sessions, [running])  # no longer queued: its age does not count

    scraped = await scrape(api)

    assert 119 <= scraped["tffleet_oldest_queued_age_seconds"]["mlp"] < 140
    assert scraped["tffleet_oldest_queued_age_seconds"]["pair"] == 0


@pytest.mark.both_databases
async def test_ready_children_are_distinct_live_children_loaded_or_draining(
    api: Api, sessions: Sessions
) -> None:
    # One child with two versions counts once; draining counts; loading and failed do not.
    report(sessions, "child-1", {("mlp", 1): LOADED, ("mlp", 2): PresenceState.DRAINING})
    report(sessions, "child-2", {("mlp", 2): PresenceState.DRAINING, ("pair", 1): LOADED})
    report(sessions, "child-3", {("mlp", 2): PresenceState.LOADING})
    report(sessions, "child-4", {("mlp", 1): PresenceState.FAILED})
    # Not heard of for more than 3 polls: taken for dead.
    report(sessions, "child-5", {("mlp", 1): LOADED, ("count", 1): LOADED}, seconds_ago=30)

    scraped = await scrape(api)

    assert scraped["tffleet_ready_children"] == {"mlp": 2, "pair": 1, "count": 0}


@pytest.mark.both_databases
async def test_backlog_per_child_divides_queued_and_running_by_ready_children(
    api: Api, sessions: Sessions
) -> None:
    start(sessions, add_jobs(sessions, 9)[:4])
    report(sessions, "child-1", {("mlp", 1): LOADED})
    report(sessions, "child-2", {("mlp", 1): LOADED})

    mlp = of(await scrape(api), "mlp")

    assert mlp["tffleet_jobs_queued"] == 5
    assert mlp["tffleet_jobs_running"] == 4
    assert mlp["tffleet_ready_children"] == 2
    assert mlp["tffleet_backlog_per_child"] == 4.5
    assert mlp["tffleet_backlog_without_capacity"] == 0


async def test_a_backlog_without_children_scales_from_zero(api: Api, sessions: Sessions) -> None:
    add_jobs(sessions, 7, model="pair")
    report(sessions, "dead-child", {("pair", 1): LOADED}, seconds_ago=60)

    scraped = await scrape(api)

    pair = of(scraped, "pair")
    assert pair["tffleet_ready_children"] == 0
    assert pair["tffleet_backlog_per_child"] == 7  # as if one child: a target of N gives 7/N
    assert pair["tffleet_backlog_without_capacity"] == 1
    assert scraped["tffleet_backlog_without_capacity"]["mlp"] == 0  # nothing waits


@pytest.mark.both_databases
async def test_a_model_with_ready_children_that_claim_nothing_reads_stalled(
    api: Api, sessions: Sessions
) -> None:
    # mlp: children connected, none claiming for 90 s (Celery consumers after a Redis failover).
    backdate(sessions, add_jobs(sessions, 3), seconds=300)
    # pair: as deep a backlog, claimed a moment ago: slow, not stalled.
    backdate(sessions, add_jobs(sessions, 3, model="pair"), seconds=300)
    with sessions.begin() as session:
        now = clock.now(session)
        for name, claimed_ago_s in (("mlp", 90), ("pair", 1)):
            presence.report(
                session=session,
                child=presence.Child(id=f"child-{name}", host="h", pid=1, device="cpu:0"),
                holdings=[
                    presence.Holding(
                        name=name,
                        version=1,
                        state=LOADED,
                        path=f"/m/{name}/1",
                        since=now,
                        claimed_at=now - timedelta(seconds=claimed_ago_s),
                    )
                ],
                now=now,
            )

    stalled = (await scrape(api))["tffleet_model_stalled_seconds"]

    assert 90 <= stalled["mlp"] < 110
    assert stalled["pair"] < 10
    assert stalled["count"] == 0  # nothing queued


async def test_the_gauges_are_read_again_after_a_second(api: Api, sessions: Sessions) -> None:
    assert (await scrape(api))["tffleet_jobs_queued"]["mlp"] == 0
    add_jobs(sessions, 3)

    await anyio.sleep(1.1)

    assert (await scrape(api))["tffleet_jobs_queued"]["mlp"] == 3


async def test_with_the_database_down_the_gauges_are_left_out_not_zero(
    open_api: OpenApi,
) -> None:
    dead = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # nothing listens on port 1
    async with open_api(database_url=dead, metrics_public=True) as api:
        response = await api.client.get("/metrics")

    assert response.status_code == 200
    assert "tffleet_jobs_submitted_total" in response.text  # this process's own metrics
    assert not any(name in response.text for name in GAUGES)


# The cache, with a clock of the test's


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def job_reads(engine: Engine) -> Iterator[list[str]]:
    """Every statement that reads the jobs table."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM jobs" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def queued(collector: AutoscalingCollector, model: str) -> float:
    for family in collector.collect():
        if family.name == "tffleet_jobs_queued":
            return next(s.value for s in family.samples if s.labels["model"] == model)
    raise AssertionError("no tffleet_jobs_queued")


def test_scrapes_within_a_second_cost_one_round_of_queries(
    sessions: Sessions, job_reads: list[str]
) -> None:
    tick = FakeMonotonic()
    collector = AutoscalingCollector(sessions, poll_s=POLL_S, monotonic=tick)
    add_jobs(sessions, 1)

    assert queued(collector, "mlp") == 1
    add_jobs(sessions, 1)
    tick.now += 0.9
    assert queued(collector, "mlp") == 1  # the cached answer
    assert len(job_reads) == 1

    tick.now += 0.1
    assert queued(collector, "mlp") == 2
    assert len(job_reads) == 2


def test_a_burst_of_concurrent_scrapes_costs_one_round_of_queries(
    sessions: Sessions, job_reads: list[str]
) -> None:
    collector = AutoscalingCollector(sessions, poll_s=POLL_S, monotonic=FakeMonotonic())
    add_jobs(sessions, 2)
    answers: list[float] = []
    barrier = threading.Barrier(8)

    def scrape_once() -> None:
        barrier.wait()
        answers.append(queued(collector, "mlp"))

    threads = [threading.Thread(target=scrape_once) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert answers == [2] * 8
    assert len(job_reads) == 1


@pytest.mark.both_databases
def test_an_age_is_never_negative(sessions: Sessions) -> None:
    # The collector reads `db.clock.now`: an age is never negative, even for a job stamped
    # a moment ahead of this host's clock.
    job_id = add_jobs(sessions, 1)[0]
    with sessions.begin() as session:
        ahead: datetime = clock.now(session) + timedelta(seconds=5)
        session.execute(update(Job).where(Job.id == job_id).values(created_at=ahead))
    collector = AutoscalingCollector(sessions, poll_s=POLL_S)

    ages = {
        s.labels["model"]: s.value
        for family in collector.collect()
        if family.name == "tffleet_oldest_queued_age_seconds"
        for s in family.samples
    }

    assert ages == {"mlp": 0.0}
