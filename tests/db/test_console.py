"""The console's reads (db/console.py) on SQLite and PostgreSQL: the backlog per model version
and tenant with its oldest queued job, jobs ended and their latency per minute, the latest
failures."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from db import clock, console, jobs
from db.models import Job, JobErrorCode, JobStatus
from tests.db.conftest import MakeJobs

Sessions = sessionmaker[Session]


def ended(sessions: Sessions, job_id: str, at: datetime, *, status: JobStatus) -> None:
    """Mark a job ended at `at`, created a second before (its latency: 1000 ms)."""
    with sessions.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=status.value, finished_at=at, created_at=at - timedelta(seconds=1))
        )


def test_minutes_count_what_ended_in_each_and_its_latency(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    with sessions() as session:
        now = clock.now(session)
    minute = now.replace(second=0, microsecond=0)
    ids = make_jobs(5)
    ended(
        sessions,
        ids[0],
        minute - timedelta(minutes=2) + timedelta(seconds=5),
        status=JobStatus.SUCCEEDED,
    )
    ended(
        sessions,
        ids[1],
        minute - timedelta(minutes=2) + timedelta(seconds=50),
        status=JobStatus.FAILED,
    )
    ended(sessions, ids[2], minute, status=JobStatus.SUCCEEDED)
    ended(sessions, ids[4], minute, status=JobStatus.CANCELED)
    ended(sessions, ids[3], minute - timedelta(minutes=30), status=JobStatus.SUCCEEDED)  # too old

    with sessions() as session:
        found = console.minutes(session=session, now=now, count=15)

    assert len(found) == 16 and found[-1].start == minute
    assert [(m.ended, m.failed, m.canceled) for m in found[-3:]] == [
        (2, 1, 0), (0, 0, 0), (2, 0, 1),
    ]  # fmt: skip
    assert sum(m.ended for m in found) == 4
    assert found[-3].p50_ms == found[-3].p95_ms == 1000.0
    assert found[-2].p50_ms is None


def test_known_minutes_are_not_read_again(sessions: Sessions, make_jobs: MakeJobs) -> None:
    with sessions() as session:
        now = clock.now(session)
    minute = now.replace(second=0, microsecond=0)
    (job_id,) = make_jobs(1)
    ended(sessions, job_id, minute, status=JobStatus.SUCCEEDED)
    with sessions() as session:
        first = console.minutes(session=session, now=now, count=15)
    # Every minute but the current one known, with a count the database never had.
    known = {m.start: console.Minute(m.start, 99, 0, 0, None, None) for m in first[:-1]}

    with sessions() as session:
        again = console.minutes(session=session, now=now, count=15, known=known)

    assert [m.ended for m in again] == [99] * 15 + [1]


def test_the_backlog_per_version_and_tenant_with_its_oldest_queued_job(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    queued = make_jobs(3, tenant="acme") + make_jobs(1, tenant="web")
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[queued[0]], owner="w", lease_s=60)
    with sessions() as session:
        rows = {row.tenant: row for row in console.unfinished(session=session)}
        oldest = jobs.get(session=session, job_id=queued[1]).created_at

    assert (rows["acme"].queued, rows["acme"].running) == (2, 1)
    assert rows["acme"].oldest_queued_at == oldest
    assert (rows["web"].queued, rows["web"].running) == (1, 0)


def test_the_latest_failures_newest_first(sessions: Sessions, make_jobs: MakeJobs) -> None:
    ids = make_jobs(3)
    for job_id in ids[:2]:
        with sessions.begin() as session:
            leases = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
        with sessions.begin() as session:
            jobs.fail(session=session, leases=leases, code=JobErrorCode.MODEL_ERROR, message=job_id)
    with sessions() as session:
        since = clock.now(session) - timedelta(hours=1)
        found = console.latest_failures(session=session, since=since)

    assert [job.id for job in found] == [ids[1], ids[0]]
