"""The response cache (db/cache.py), on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db import cache, clock, jobs, tenants
from db.models import CacheEntry, Job, JobInput, JobStatus

Sessions = sessionmaker[Session]


def new(inputs: bytes, *, tenant: str = "default", scope: str | None = None) -> jobs.NewJob:
    key = cache.key(model="m", version=1, scope=scope or tenant, inputs=inputs)
    return jobs.NewJob(model="m", version=1, samples=1, inputs=inputs, tenant=tenant, cache_key=key)


def submit(sessions: Sessions, job: jobs.NewJob) -> Job:
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=job.tenant)
        (created,) = jobs.create(session=session, jobs=[job])
    with sessions() as session:
        stored = jobs.get(session=session, job_id=created.id)
        _ = stored.outputs
        return stored


def run(sessions: Sessions, job_id: str, outputs: bytes) -> None:
    """A worker claims the job and writes `outputs`."""
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=30)
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, outputs)]) == 1


def test_a_repeated_input_ends_at_once_with_the_stored_outputs(sessions: Sessions) -> None:
    first = submit(sessions, new(b"x1"))
    assert (first.status, first.cached) == (JobStatus.QUEUED, False)
    run(sessions, first.id, b"y1")

    again = submit(sessions, new(b"x1"))

    assert (again.status, again.cached, again.outputs) == (JobStatus.SUCCEEDED, True, b"y1")
    assert (again.attempts, again.worker) == (0, None)
    assert again.started_at == again.finished_at is not None
    with sessions() as session:  # nothing to run: no inputs stored
        assert session.get(JobInput, again.id) is None


def test_other_inputs_and_other_tenants_miss_unless_the_model_shares_its_cache(
    sessions: Sessions,
) -> None:
    run(sessions, submit(sessions, new(b"x1", tenant="a")).id, b"y1")
    run(sessions, submit(sessions, new(b"x2", tenant="s", scope=cache.SHARED)).id, b"y2")

    assert submit(sessions, new(b"x9", tenant="a")).status == JobStatus.QUEUED
    assert submit(sessions, new(b"x1", tenant="b")).status == JobStatus.QUEUED
    assert submit(sessions, new(b"x1", tenant="a")).cached
    shared = submit(sessions, new(b"x2", tenant="t", scope=cache.SHARED))
    assert (shared.cached, shared.outputs) == (True, b"y2")


def test_jobs_of_a_model_without_a_cache_never_store_or_hit_it(sessions: Sessions) -> None:
    plain = jobs.NewJob(model="m", version=1, samples=1, inputs=b"x1")
    run(sessions, submit(sessions, plain).id, b"y1")

    assert submit(sessions, plain).status == JobStatus.QUEUED
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(CacheEntry)) == 0


def test_a_keyed_request_is_answered_from_the_cache_too(sessions: Sessions) -> None:
    run(sessions, submit(sessions, new(b"x1")).id, b"y1")
    keyed = [
        jobs.NewJob(**{**new(b"x1").__dict__, "idempotency_key": "k", "request_hash": "h"}),
        jobs.NewJob(**{**new(b"x2").__dict__, "idempotency_key": "k 1", "request_hash": "h"}),
    ]

    with sessions.begin() as session:
        (submitted,) = jobs.create_idempotent(session=session, requests=[keyed])

    assert [(row.status, row.cached) for row in submitted.jobs] == [
        (JobStatus.SUCCEEDED.value, True),
        (JobStatus.QUEUED.value, False),
    ]


def test_purge_drops_entries_past_their_age_then_the_oldest_over_the_size_bound(
    sessions: Sessions,
) -> None:
    with sessions.begin() as session:
        now = clock.now(session)
        for n, age_s in enumerate([500, 300, 200, 100]):
            cache.remember(
                session=session,
                entries=[(f"k{n}", b"o" * 10)],
                now=now - timedelta(seconds=age_s),
            )

    with sessions.begin() as session:
        purged = cache.purge(
            session=session, older_than=now - timedelta(seconds=400), max_bytes=20, limit=100
        )

    assert purged == 2  # k0 by age; then k1, the oldest, while over 20 bytes
    with sessions() as session:
        assert sorted(session.scalars(select(CacheEntry.key))) == ["k2", "k3"]


def test_a_result_fenced_out_still_stores_its_outputs_for_its_inputs(sessions: Sessions) -> None:
    """A late worker's write changes no job, but its outputs are still those of its inputs."""
    first = submit(sessions, new(b"x1"))
    with sessions.begin() as session:
        (stale,) = jobs.claim(session=session, job_ids=[first.id], owner="w", lease_s=30)
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=first.id)
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(stale, b"y1")]) == 0

    again = submit(sessions, new(b"x1"))

    assert (again.cached, again.outputs) == (True, b"y1")


def test_a_stored_key_keeps_its_first_outputs_and_purge_takes_at_most_its_limit(
    sessions: Sessions,
) -> None:
    with sessions.begin() as session:
        now = clock.now(session)
        cache.remember(session=session, entries=[("k", b"first"), ("j", b"o")], now=now)
        cache.remember(session=session, entries=[("k", b"second")], now=now)
        assert session.scalar(select(CacheEntry.outputs).where(CacheEntry.key == "k")) == b"first"

    with sessions.begin() as session:
        later = now + timedelta(seconds=1)
        assert cache.purge(session=session, older_than=later, max_bytes=0, limit=1) == 1
    with sessions.begin() as session:
        assert cache.purge(session=session, older_than=later, max_bytes=0, limit=5) == 1
        assert session.scalar(select(func.count()).select_from(CacheEntry)) == 0
