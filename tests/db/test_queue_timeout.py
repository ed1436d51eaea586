"""`Queue-Timeout` in the job state machine, on SQLite and on PostgreSQL (every test runs on
both): a job no worker started by then ends `canceled` (`queue_timeout`) without running; the
claim cancels it instead of starting it, the sweeper's `cancel_late` cancels the rest."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, tenants, webhooks
from db.models import JobErrorCode, JobStatus, WebhookDelivery
from tests.db.conftest import read

Sessions = sessionmaker[Session]


def create(sessions: Sessions, count: int = 1, **kw: object) -> list[str]:
    new = jobs.NewJob(model="m", version=1, samples=1, inputs=b"in", **kw)  # type: ignore[arg-type]
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=new.tenant)
        return [row.id for row in jobs.create(session=session, jobs=[new] * count)]


def late(sessions: Sessions, *, ahead_s: float = 0) -> jobs.Late:
    """One chunk of the sweeper's cancels, `ahead_s` from the database's now."""
    with sessions.begin() as session:
        now = clock.now(session) + timedelta(seconds=ahead_s)
        return jobs.cancel_late(session=session, now=now, limit=1000)


def test_a_job_stores_its_queue_timeout_after_its_creation(sessions: Sessions) -> None:
    (job_id,) = create(sessions, queue_timeout_s=45)
    job = read(sessions, job_id)
    assert job.queue_timeout_at is not None
    assert job.queue_timeout_at - job.created_at == timedelta(seconds=45)
    assert read(sessions, create(sessions)[0]).queue_timeout_at is None


def test_a_claim_cancels_a_job_past_its_queue_timeout_instead_of_starting_it(
    sessions: Sessions,
) -> None:
    (late_id,) = create(sessions, queue_timeout_s=0.001)
    (in_time,) = create(sessions, queue_timeout_s=60)
    time.sleep(0.05)
    canceled: list[str] = []
    with sessions.begin() as session:
        leases = jobs.claim(
            session=session, job_ids=[late_id, in_time], owner="w", lease_s=60, canceled=canceled
        )

    assert [lease.job_id for lease in leases] == [in_time]
    assert canceled == [late_id]
    job = read(sessions, late_id)
    assert (job.status, job.error_code) == (JobStatus.CANCELED, JobErrorCode.QUEUE_TIMEOUT)
    assert job.attempts == 0 and job.started_at is None and job.worker is None
    assert job.device_s == 0 and job.finished_at is not None
    assert "before it ran" in (job.error_message or "")


def test_claim_next_never_starts_a_job_past_its_queue_timeout(sessions: Sessions) -> None:
    (late_id,) = create(sessions, queue_timeout_s=0.001)
    (other,) = create(sessions)
    time.sleep(0.05)
    canceled: list[str] = []
    with sessions.begin() as session:
        leases = jobs.claim_next(
            session=session,
            model="m",
            version=1,
            owner="w",
            lease_s=60,
            max_samples=8,
            canceled=canceled,
        )

    assert [lease.job_id for lease in leases] == [other]
    assert canceled == [late_id]
    assert read(sessions, late_id).error_code == JobErrorCode.QUEUE_TIMEOUT


def test_a_job_past_its_deadline_and_its_queue_timeout_is_canceled_once(
    sessions: Sessions,
) -> None:
    (job_id,) = create(sessions, queue_timeout_s=0.001, cancel_after_s=0.001)
    time.sleep(0.05)
    canceled: list[str] = []
    with sessions.begin() as session:
        leases = jobs.claim(
            session=session, job_ids=[job_id], owner="w", lease_s=60, canceled=canceled
        )

    assert leases == [] and canceled == [job_id]
    assert read(sessions, job_id).status == JobStatus.CANCELED


def test_cancel_late_cancels_queued_jobs_never_started_past_their_queue_timeout(
    sessions: Sessions,
) -> None:
    queued, running = create(sessions, 2, queue_timeout_s=30)
    (later,) = create(sessions, queue_timeout_s=120)
    (without,) = create(sessions)
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[running], owner="w", lease_s=600)

    assert late(sessions) == jobs.Late(deadline=[], queue_timeout=[])
    swept = late(sessions, ahead_s=31)

    assert swept == jobs.Late(deadline=[], queue_timeout=[queued])
    assert read(sessions, queued).error_code == JobErrorCode.QUEUE_TIMEOUT
    # A job that started is past its queue time-out: only its deadline (if any) ends it.
    assert read(sessions, running).status == JobStatus.RUNNING
    assert read(sessions, later).status == read(sessions, without).status == JobStatus.QUEUED
    assert late(sessions, ahead_s=31).queue_timeout == []  # done once


def test_a_job_taken_back_from_its_worker_started_and_its_queue_timeout_no_longer_applies(
    sessions: Sessions,
) -> None:
    (job_id,) = create(sessions, queue_timeout_s=0.2)
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
    with sessions.begin() as session:
        assert jobs.release(session=session, leases=leases) == 1  # not the job's fault
    time.sleep(0.3)

    assert late(sessions).queue_timeout == []
    with sessions.begin() as session:
        again = jobs.claim(session=session, job_ids=[job_id], owner="w2", lease_s=60)
    assert [lease.job_id for lease in again] == [job_id]


def test_a_job_unclaimed_before_it_ran_is_still_within_its_queue_timeout(
    sessions: Sessions,
) -> None:
    (job_id,) = create(sessions, queue_timeout_s=30)
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
    with sessions.begin() as session:
        assert jobs.unclaim(session=session, leases=leases) == 1  # never ran: not started

    assert late(sessions, ahead_s=31).queue_timeout == [job_id]


def test_a_queue_timeout_cancel_records_the_completed_webhook(sessions: Sessions) -> None:
    (job_id,) = create(
        sessions,
        queue_timeout_s=30,
        webhook="https://example.com/hook",
        webhook_events=webhooks.bits(["completed"]),
    )

    assert late(sessions, ahead_s=31).queue_timeout == [job_id]
    with sessions() as session:
        recorded = session.scalar(
            select(func.count())
            .select_from(WebhookDelivery)
            .where(WebhookDelivery.job_id == job_id)
        )
    assert recorded == 1


def test_a_retry_takes_a_new_queue_timeout_or_none(sessions: Sessions) -> None:
    (job_id,) = create(sessions, queue_timeout_s=30)
    late(sessions, ahead_s=31)

    with sessions.begin() as session:
        job = jobs.retry(session=session, job_id=job_id, queue_timeout_s=90)
        assert (job.status, job.error_code, job.started_at) == (JobStatus.QUEUED, None, None)
        assert job.queue_timeout_at is not None
        assert job.queue_timeout_at - clock.now(session) <= timedelta(seconds=90)
    assert late(sessions, ahead_s=60).queue_timeout == []
    assert late(sessions, ahead_s=91).queue_timeout == [job_id]

    with sessions.begin() as session:
        job = jobs.retry(session=session, job_id=job_id)
        assert job.queue_timeout_at is None
    assert late(sessions, ahead_s=3600).queue_timeout == []
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
    assert [lease.job_id for lease in leases] == [job_id]
