"""A job's history: each attempt's start and worker, each return to the queue and why, each
retry; appended by the UPDATE that makes the change (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs
from db.models import Job, JobErrorCode
from tests.db.conftest import MakeJobs

Sessions = sessionmaker[Session]


def history(sessions: Sessions, job_id: str) -> list[tuple[str, str]]:
    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        return [(event.event, event.detail) for event in jobs.history_of(job)]


def test_each_attempt_and_each_return_to_the_queue_is_a_line_of_its_own(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    (job_id,) = make_jobs(1)
    assert history(sessions, job_id) == []

    with sessions.begin() as session:
        jobs.claim(
            session=session, job_ids=[job_id], owner="w1", lease_s=0.01, worker="host-a/7/cpu:0"
        )
    with sessions.begin() as session:
        later = clock.now(session) + timedelta(seconds=5)
        jobs.expire_leases(session=session, now=later, max_attempts=5)
    with sessions.begin() as session:
        (lease,) = jobs.claim(
            session=session, job_ids=[job_id], owner="w2", lease_s=60, worker="host-b/8/gpu:1"
        )
    with sessions.begin() as session:
        jobs.fail(session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="boom")
    with sessions.begin() as session:
        jobs.retry(session=session, job_id=job_id)
    with sessions.begin() as session:
        (lease,) = jobs.claim(
            session=session, job_ids=[job_id], owner="w3", lease_s=60, worker="w3"
        )
    with sessions.begin() as session:
        jobs.release(session=session, leases=[lease])
    with sessions.begin() as session:
        (lease,) = jobs.claim(
            session=session, job_ids=[job_id], owner="w4", lease_s=60, worker="w4"
        )
    with sessions.begin() as session:
        jobs.unclaim(session=session, leases=[lease])

    assert history(sessions, job_id) == [
        ("started", "host-a/7/cpu:0"),
        ("requeued", "each attempt's lease expired without a result"),
        ("started", "host-b/8/gpu:1"),
        ("failed", "model_error"),
        ("retried", ""),
        ("started", "w3"),
        ("requeued", "handed back by its worker"),
        ("started", "w4"),
        ("put back", "its worker began shutting down before it ran"),
    ]


def test_the_lines_carry_their_times_in_order(sessions: Sessions, make_jobs: MakeJobs) -> None:
    (job_id,) = make_jobs(1)
    for owner in ("w1", "w2"):
        with sessions.begin() as session:
            (lease,) = jobs.claim(session=session, job_ids=[job_id], owner=owner, lease_s=60)
        with sessions.begin() as session:
            jobs.release(session=session, leases=[lease])

    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        events = jobs.history_of(job)
        created = job.created_at
    assert [e.event for e in events] == ["started", "requeued", "started", "requeued"]
    times = [e.at for e in events]
    assert times == sorted(times) and times[0] >= created


def test_a_line_this_code_did_not_write_is_skipped() -> None:
    job = Job(history="started\tnot a time\tw\ngarbage\nretried\t2026-11-24T10:00:00+00:00\t\n")
    assert [(e.event, e.detail) for e in jobs.history_of(job)] == [("retried", "")]
