"""A queued job's position and ETA against the real claim (SQLite and PostgreSQL): each job's
position is how many jobs `claim_next` takes before it."""

from __future__ import annotations

import random
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, standing, tenants
from db.models import Job
from db.recent import Recent
from tests.db.conftest import MakeJobs

Sessions = sessionmaker[Session]


def positions(sessions: Sessions, ids: list[str], *, bulk: bool = False) -> dict[str, int]:
    with sessions() as session:
        rows = jobs.get_many(session=session, job_ids=ids)
        if bulk:
            placed = standing.place(session=session, jobs=rows, recent=fresh())
        else:  # one statement per job, as a GET of one job reads it
            placed = {}
            for row in rows:
                placed.update(standing.place(session=session, jobs=[row], recent=fresh()))
    return {job_id: s.queue_position for job_id, s in placed.items()}


def fresh() -> Recent:
    """Sizes and pace read on every call: what the claim sees now."""
    return Recent(refresh_s=0)


def claim_order(sessions: Sessions, *, batch: int) -> list[str]:
    """Every queued job of m:1, in the order the claim takes them, `batch` samples a claim."""
    order: list[str] = []
    while True:
        with sessions.begin() as session:
            leases = jobs.claim_next(
                session=session, model="m", version=1, owner="w", lease_s=60, max_samples=batch
            )
        if not leases:
            return order
        order += [lease.job_id for lease in leases]


def test_one_tenants_positions_follow_priority_then_age_exactly(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = []
    for priority in (0, 5, 0, -3, 5, 1):
        ids += make_jobs(2, priority=priority)

    before = positions(sessions, ids)
    order = claim_order(sessions, batch=1)

    assert before == {job_id: order.index(job_id) for job_id in ids}


def test_tenants_taking_turns_in_one_batch_are_placed_exactly(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name="heavy")
        tenants.set_limits(session=session, name="heavy", weight=3)
    ids = interleaved(make_jobs, priorities=[0])

    before = positions(sessions, ids)
    order = claim_order(sessions, batch=10_000)

    assert before == {job_id: order.index(job_id) for job_id in ids}


def test_other_tenants_priorities_move_a_position_by_at_most_one_job_each(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    # On equal shares the claim takes the older of the tenants' next jobs; a tenant's queued
    # jobs older than this one stand in for "its next is older", which its priorities can upset.
    ids = interleaved(make_jobs, priorities=[0, 0, 1, 2])

    before = positions(sessions, ids)
    order = claim_order(sessions, batch=10_000)

    assert all(abs(before[job_id] - order.index(job_id)) <= 2 for job_id in ids)
    assert sum(before[job_id] == order.index(job_id) for job_id in ids) > len(ids) // 2


def interleaved(make_jobs: MakeJobs, *, priorities: list[int]) -> list[str]:
    """40 jobs of three tenants submitted in random turns; each tenant's jobs of one size."""
    rng = random.Random(13)
    ids = []
    for _ in range(40):
        tenant, samples = rng.choice([("a", 1), ("b", 2), ("heavy", 1)])
        ids += make_jobs(1, tenant=tenant, samples=samples, priority=rng.choice(priorities))
    return ids


def test_tenants_over_many_batches_are_placed_within_a_job_per_other_tenant_per_batch(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = []
    for _ in range(15):
        ids += make_jobs(1, tenant="a") + make_jobs(1, tenant="b") + make_jobs(1, tenant="c")
    batch = 4

    before = positions(sessions, ids)
    order = claim_order(sessions, batch=batch)

    for job_id in ids:
        true = order.index(job_id)
        assert abs(before[job_id] - true) <= 2 * (true // batch + 1), job_id


def test_reading_the_queue_once_places_jobs_as_one_statement_each_does(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    rng = random.Random(7)
    ids = []
    for _ in range(30):
        tenant = rng.choice("abc")
        ids += make_jobs(1, tenant=tenant, samples=rng.choice([1, 3]), priority=rng.choice([0, 2]))

    assert positions(sessions, ids, bulk=True) == positions(sessions, ids)


def test_only_queued_jobs_that_are_not_parts_are_placed(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    first, second = make_jobs(2)
    claim_order(sessions, batch=1)  # both running now
    (third,) = make_jobs(1)

    assert positions(sessions, [first, second, third]) == {third: 0}


def test_the_eta_is_the_samples_ahead_and_its_own_at_the_recent_pace(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    done = make_jobs(10, samples=2)
    with sessions.begin() as session:
        leases = jobs.claim_next(
            session=session, model="m", version=1, owner="w", lease_s=60, max_samples=100
        )
        now = clock.now(session)
        # 20 samples, started 100 s ago: 0.2 samples a second.
        session.query(Job).filter(Job.id.in_(done)).update(
            {Job.started_at: now - timedelta(seconds=100)}, synchronize_session=False
        )
        jobs.complete(session=session, results=[(lease, b"out") for lease in leases], now=now)
    ahead, mine = make_jobs(3, samples=2), make_jobs(1, samples=2)

    with sessions() as session:
        rows = jobs.get_many(session=session, job_ids=ahead + mine)
        placed = standing.place(session=session, jobs=rows, recent=fresh())

    assert placed[mine[0]].queue_position == 3
    # (6 samples ahead + its own 2) / about 0.2 a second (the clock moved on a little).
    eta = placed[mine[0]].eta_s
    assert eta is not None and 40.0 <= eta < 44.0
    first = placed[ahead[0]].eta_s
    assert first is not None and 10.0 <= first < 11.0


def test_no_eta_without_recent_throughput(make_jobs: MakeJobs, sessions: Sessions) -> None:
    ids = make_jobs(2)
    with sessions() as session:
        rows = jobs.get_many(session=session, job_ids=ids)
        placed = standing.place(session=session, jobs=rows, recent=fresh())

    assert [placed[job_id].eta_s for job_id in ids] == [None, None]
    assert [placed[job_id].queue_position for job_id in ids] == [0, 1]


def test_deadlines_order_a_tenants_positions_exactly_as_they_order_the_claim(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(4) + make_jobs(2, priority=2)
    for cancel_after_s, priority in ((600, 0), (60, 0), (300, 2), (60, -1), (30, 0), (600, 0)):
        new = jobs.NewJob(
            model="m",
            version=1,
            samples=1,
            inputs=b"in",
            priority=priority,
            cancel_after_s=cancel_after_s,
        )
        with sessions.begin() as session:
            ids += [row.id for row in jobs.create(session=session, jobs=[new])]

    before = positions(sessions, ids)
    assert positions(sessions, ids, bulk=True) == before  # 12 jobs: the queue read once
    order = claim_order(sessions, batch=1)

    assert before == {job_id: order.index(job_id) for job_id in ids}


def test_jobs_stored_together_are_placed_as_one_statement_each_places_them(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    """A submit's jobs (`together`): one statement per class, the rest counted on from it."""
    rng = random.Random(11)
    for _ in range(20):  # a queue before them, of three tenants
        make_jobs(
            1, tenant=rng.choice("abc"), samples=rng.choice([1, 3]), priority=rng.choice([0, 2])
        )
    ids = make_jobs(12, tenant="a", samples=2) + make_jobs(15, tenant="b", priority=2)
    with sessions.begin() as session:  # one request of mixed priorities, their ids interleaved
        mixed = [
            jobs.NewJob(model="m", version=1, samples=1, inputs=b"in", priority=i % 3, tenant="c")
            for i in range(9)
        ]
        # Two tenants' requests stored in one transaction (the API's ingestor gathers them),
        # their turns tied: the older of two goes first.
        mixed += [
            jobs.NewJob(model="m", version=1, samples=1, inputs=b"in", tenant="de"[i % 2])
            for i in range(8)
        ]
        for tenant in "de":
            tenants.ensure_tenant(session=session, name=tenant)
        ids += [row.id for row in jobs.create(session=session, jobs=mixed)]

    with sessions() as session:
        rows = jobs.get_many(session=session, job_ids=ids)
        together = standing.place(session=session, jobs=rows, recent=fresh(), together=True)

    assert {job_id: s.queue_position for job_id, s in together.items()} == positions(sessions, ids)
