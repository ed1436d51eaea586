"""Deadlines (`Cancel-After`), retry and delete in the job state machine, on SQLite and on
PostgreSQL (every test runs on both)."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db import cache, clock, jobs, parts, tenants
from db.models import CacheEntry, Job, JobErrorCode, JobInput, JobStatus
from tests.db.conftest import read
from tffleet import tensors
from tffleet.errors import InputsGone, JobNotEnded, JobNotFound, JobNotRetryable

Sessions = sessionmaker[Session]


def create(
    sessions: Sessions, *, cancel_after_s: float | None = None, inputs: bytes = b"in", **kw: object
) -> str:
    new = jobs.NewJob(
        model="m", version=1, samples=1, inputs=inputs, cancel_after_s=cancel_after_s, **kw
    )  # type: ignore[arg-type]
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=new.tenant)
        return jobs.create(session=session, jobs=[new])[0].id


def claim(sessions: Sessions, job_ids: list[str], owner: str = "w1") -> list[jobs.Lease]:
    with sessions.begin() as session:
        return jobs.claim(session=session, job_ids=job_ids, owner=owner, lease_s=60)


def overdue(sessions: Sessions, *, ahead_s: float = 0) -> list[str]:
    with sessions.begin() as session:
        now = clock.now(session) + timedelta(seconds=ahead_s)
        return jobs.cancel_overdue(session=session, now=now)


def count(sessions: Sessions, table: type[Job] | type[JobInput] | type[CacheEntry]) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


# Deadlines


def test_a_job_stores_its_deadline_cancel_after_its_creation(sessions: Sessions) -> None:
    job = read(sessions, create(sessions, cancel_after_s=90))
    assert job.deadline_at is not None
    assert job.deadline_at - job.created_at == timedelta(seconds=90)
    assert read(sessions, create(sessions)).deadline_at is None


def test_a_claim_cancels_a_job_past_its_deadline_instead_of_starting_it(
    sessions: Sessions,
) -> None:
    late = create(sessions, cancel_after_s=0.001)
    in_time = create(sessions, cancel_after_s=60)
    time.sleep(0.05)
    assert [lease.job_id for lease in claim(sessions, [late, in_time])] == [in_time]
    job = read(sessions, late)
    assert job.status == JobStatus.CANCELED and job.attempts == 0 and job.started_at is None
    assert job.error_code == JobErrorCode.DEADLINE
    assert "before it ran" in (job.error_message or "")


def test_claim_next_never_starts_a_job_past_its_deadline(sessions: Sessions) -> None:
    late = create(sessions, cancel_after_s=0.001)
    time.sleep(0.05)
    with sessions.begin() as session:
        leases = jobs.claim_next(
            session=session, model="m", version=1, owner="w1", lease_s=60, max_samples=8
        )
    assert leases == []
    assert read(sessions, late).status == JobStatus.CANCELED


def test_cancel_overdue_cancels_queued_and_running_jobs_and_fences_out_the_late_result(
    sessions: Sessions,
) -> None:
    queued = create(sessions, cancel_after_s=10)
    running = create(sessions, cancel_after_s=10)
    (lease,) = claim(sessions, [running])
    assert overdue(sessions) == []  # not yet
    assert overdue(sessions, ahead_s=11) == sorted([queued, running])
    for job_id, when in ((queued, "before it ran"), (running, "while running")):
        job = read(sessions, job_id)
        assert job.status == JobStatus.CANCELED and job.error_code == JobErrorCode.DEADLINE
        assert when in (job.error_message or "") and job.lease_owner is None
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"late")]) == 0
        assert jobs.heartbeat(session=session, leases=[lease], lease_s=60) == 0
    assert read(sessions, running).outputs is None
    assert overdue(sessions, ahead_s=11) == []  # ended jobs stay as they are


def test_cancel_overdue_leaves_jobs_without_a_deadline_and_ended_jobs_alone(
    sessions: Sessions,
) -> None:
    plain = create(sessions)
    ended = create(sessions, cancel_after_s=10)
    (lease,) = claim(sessions, [ended])
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, b"out")])
    assert overdue(sessions, ahead_s=3600) == []
    assert read(sessions, plain).status == JobStatus.QUEUED
    assert read(sessions, ended).status == JobStatus.SUCCEEDED


# Retry


def test_retry_of_a_job_failed_worker_lost_queues_it_with_a_fresh_attempt_budget(
    sessions: Sessions,
) -> None:
    job_id = create(sessions)
    for _ in range(2):
        claim(sessions, [job_id])
        with sessions.begin() as session:
            now = clock.now(session) + timedelta(seconds=120)
            jobs.expire_leases(session=session, now=now, max_attempts=2)
    job = read(sessions, job_id)
    assert job.status == JobStatus.FAILED and job.error_code == JobErrorCode.WORKER_LOST
    with sessions.begin() as session:
        again = jobs.retry(session=session, job_id=job_id, cancel_after_s=30)
        assert again.status == JobStatus.QUEUED and again.error_code is None
        assert again.error_message is None and again.finished_at is None
        assert again.attempts == 2 and again.budget_from == 2 and again.deadline_at is not None
    # A lost claim after the retry is the first of its new budget: queued again, not failed.
    (lease,) = claim(sessions, [job_id])
    assert lease.attempt == 3
    with sessions.begin() as session:
        now = clock.now(session) + timedelta(seconds=120)
        taken = jobs.expire_leases(session=session, now=now, max_attempts=2)
    assert taken.requeued == {("m", 1): [job_id]} and taken.failed == []


def test_retry_keeps_a_late_result_of_the_earlier_run_out(sessions: Sessions) -> None:
    job_id = create(sessions)
    (old,) = claim(sessions, [job_id], owner="w1")
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=job_id)
    with sessions.begin() as session:
        jobs.retry(session=session, job_id=job_id)
    (new,) = claim(sessions, [job_id], owner="w1")  # the same owner, even
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(old, b"late")]) == 0
        assert jobs.complete(session=session, results=[(new, b"new")]) == 1
    job = read(sessions, job_id)
    assert job.status == JobStatus.SUCCEEDED and job.outputs == b"new" and job.attempts == 2


@pytest.mark.parametrize("status", ["queued", "running", "succeeded"])
def test_retry_of_a_queued_running_or_succeeded_job_is_not_retryable(
    sessions: Sessions, status: str
) -> None:
    job_id = create(sessions)
    if status != "queued":
        (lease,) = claim(sessions, [job_id])
    if status == "succeeded":
        with sessions.begin() as session:
            jobs.complete(session=session, results=[(lease, b"out")])
    with sessions.begin() as session, pytest.raises(JobNotRetryable, match=f"is {status}"):
        jobs.retry(session=session, job_id=job_id)
    assert read(sessions, job_id).status == status


def test_retry_and_remove_of_another_tenants_job_are_not_found(sessions: Sessions) -> None:
    job_id = create(sessions, tenant="acme")
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=job_id)
    with sessions.begin() as session, pytest.raises(JobNotFound):
        jobs.retry(session=session, job_id=job_id, tenant="other")
    with sessions.begin() as session, pytest.raises(JobNotFound):
        jobs.remove(session=session, job_id=job_id, tenant="other")
    with sessions.begin() as session:
        assert jobs.retry(session=session, job_id=job_id, tenant="acme").status == "queued"


def test_retry_of_a_job_without_its_inputs_raises_inputs_gone(sessions: Sessions) -> None:
    job_id = create(sessions)
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=job_id)
        session.execute(JobInput.__table__.delete())  # as a job split by an older tffleet
    with sessions.begin() as session, pytest.raises(InputsGone, match="no longer stored"):
        jobs.retry(session=session, job_id=job_id)


def test_retry_of_a_failed_split_job_drops_its_parts_and_runs_it_whole(
    sessions: Sessions,
) -> None:
    packed = tensors.pack({"x": np.arange(8, dtype=np.float32).reshape(4, 2)})
    new = jobs.NewJob(model="m", version=1, samples=4, inputs=packed)
    with sessions.begin() as session:
        job_id = jobs.create(session=session, jobs=[new])[0].id
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        ids = parts.split(session=session, lease=lease, model="m", version=1, part_samples=2)
    (part,) = claim(sessions, ids[:1], owner="w2")
    with sessions.begin() as session:
        jobs.fail(session=session, leases=[part], code=JobErrorCode.MODEL_ERROR, message="boom")
        parts.settle(session=session, parent_ids=[job_id])
    assert read(sessions, job_id).status == JobStatus.FAILED
    with sessions.begin() as session:
        again = jobs.retry(session=session, job_id=job_id)
        assert again.parts is None and again.samples_done is None
    assert count(sessions, Job) == 1  # its parts are gone
    (whole,) = claim(sessions, [job_id])
    assert whole.samples == 4 and whole.inputs == packed


# Delete


@pytest.mark.parametrize("end", ["succeeded", "failed", "canceled"])
def test_remove_deletes_an_ended_job_with_its_inputs_and_outputs(
    sessions: Sessions, end: str
) -> None:
    job_id = create(sessions)
    kept = create(sessions)
    if end == "canceled":
        with sessions.begin() as session:
            jobs.cancel(session=session, job_id=job_id)
    else:
        (lease,) = claim(sessions, [job_id])
        with sessions.begin() as session:
            if end == "succeeded":
                jobs.complete(session=session, results=[(lease, b"out")])
            else:
                jobs.fail(session=session, leases=[lease], code=JobErrorCode.TIMEOUT, message="")
    with sessions.begin() as session:
        jobs.remove(session=session, job_id=job_id)
    with sessions() as session, pytest.raises(JobNotFound):
        jobs.get(session=session, job_id=job_id)
    assert count(sessions, Job) == 1 and count(sessions, JobInput) == 1
    assert read(sessions, kept).status == JobStatus.QUEUED


@pytest.mark.parametrize("status", ["queued", "running"])
def test_remove_of_a_queued_or_running_job_raises_job_not_ended(
    sessions: Sessions, status: str
) -> None:
    job_id = create(sessions)
    if status == "running":
        claim(sessions, [job_id])
    with sessions.begin() as session, pytest.raises(JobNotEnded, match="cancel it first"):
        jobs.remove(session=session, job_id=job_id)
    assert read(sessions, job_id).status == status


def test_remove_takes_the_jobs_outputs_out_of_the_response_cache(sessions: Sessions) -> None:
    key = cache.key(model="m", version=1, scope="default", inputs=b"in")
    job_id = create(sessions, cache_key=key)
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, b"out")])
    assert count(sessions, CacheEntry) == 1
    with sessions.begin() as session:
        jobs.remove(session=session, job_id=job_id)
    assert count(sessions, CacheEntry) == 0


def test_remove_of_an_unknown_job_raises_job_not_found(sessions: Sessions) -> None:
    with sessions.begin() as session, pytest.raises(JobNotFound):
        jobs.remove(session=session, job_id="00000000-0000-7000-8000-000000000000")
