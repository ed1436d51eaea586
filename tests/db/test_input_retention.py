"""Ended jobs' inputs go before the jobs (TFFLEET_INPUT_TTL_S), on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, parts
from db.clock import utcnow
from db.models import JobInput, JobStatus
from tests.db.conftest import MakeJobs, read
from tffleet import tensors

Sessions = sessionmaker[Session]

HOUR = timedelta(hours=1)


def finish_at(sessions: Sessions, job_id: str, status: JobStatus, at: datetime) -> None:
    with sessions.begin() as session:
        job = jobs.get(session=session, job_id=job_id)
        job.status, job.finished_at = status.value, at


def kept(sessions: Sessions) -> set[str]:
    """The jobs whose inputs are stored."""
    with sessions() as session:
        return set(session.scalars(select(JobInput.job_id)))


def purge(sessions: Sessions, *, since: datetime, older_than: datetime, limit: int = 100) -> int:
    with sessions.begin() as session:
        return jobs.purge_inputs(
            session=session, since=since, older_than=older_than, limit=limit
        ).deleted


def test_ended_jobs_lose_their_inputs_after_the_cutoff_and_keep_their_outputs(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    ok, failed, canceled, young, queued, running = make_jobs(6)
    finish_at(sessions, ok, JobStatus.SUCCEEDED, now - 2 * HOUR)
    finish_at(sessions, failed, JobStatus.FAILED, now - 2 * HOUR)
    finish_at(sessions, canceled, JobStatus.CANCELED, now - 2 * HOUR)
    finish_at(sessions, young, JobStatus.SUCCEEDED, now - HOUR / 2)
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[running], owner="w", lease_s=60)

    assert purge(sessions, since=now - 30 * HOUR, older_than=now - HOUR) == 3

    assert kept(sessions) == {young, queued, running}
    # The jobs themselves stay until their own retention.
    assert read(sessions, ok).status == JobStatus.SUCCEEDED
    assert read(sessions, failed).status == JobStatus.FAILED


def test_only_jobs_that_ended_since_the_last_pass_are_looked_at(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    before, within = make_jobs(2)
    finish_at(sessions, before, JobStatus.SUCCEEDED, now - 3 * HOUR)
    finish_at(sessions, within, JobStatus.SUCCEEDED, now - 2 * HOUR)

    assert purge(sessions, since=now - 2 * HOUR, older_than=now - HOUR) == 1
    assert kept(sessions) == {before}


def test_inputs_go_in_chunks_earliest_first_and_each_says_where_it_reached(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    ids = make_jobs(5)
    ends = [now - timedelta(hours=5 - i) for i in range(5)]
    for job_id, at in zip(ids, ends, strict=True):
        finish_at(sessions, job_id, JobStatus.SUCCEEDED, at)

    since, chunks = now - 10 * HOUR, []
    while True:
        with sessions.begin() as session:
            purged = jobs.purge_inputs(session=session, since=since, older_than=now, limit=2)
        if not purged.deleted:
            break
        chunks.append(purged.deleted)
        assert purged.reached is not None
        since = purged.reached

    assert chunks == [2, 2, 1]
    assert since == ends[-1]
    assert kept(sessions) == set()


def test_the_oldest_kept_inputs_are_those_of_the_earliest_ended_job_that_has_them(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    with sessions() as session:
        assert jobs.oldest_kept_inputs(session=session) is None
    gone, first, later, _queued = make_jobs(4)
    finish_at(sessions, gone, JobStatus.SUCCEEDED, now - 9 * HOUR)
    finish_at(sessions, first, JobStatus.FAILED, now - 5 * HOUR)
    finish_at(sessions, later, JobStatus.SUCCEEDED, now - 2 * HOUR)
    purge(sessions, since=now - 10 * HOUR, older_than=now - 8 * HOUR)

    with sessions() as session:
        assert jobs.oldest_kept_inputs(session=session) == now - 5 * HOUR


def test_a_split_job_keeps_its_inputs_while_its_parts_run_and_still_joins_its_outputs(
    sessions: Sessions,
) -> None:
    x = np.arange(4, dtype=np.float32)
    new = jobs.NewJob(model="m", version=1, samples=4, inputs=tensors.pack({"x": x}))
    with sessions.begin() as session:
        (job,) = jobs.create(session=session, jobs=[new])
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job.id], owner="w", lease_s=60)
        first, second = parts.split(
            session=session, lease=lease, model="m", version=1, part_samples=2
        )
    run_parts(sessions, [first])
    ended_at = read(sessions, first).finished_at
    assert ended_at is not None

    # The first part ended long ago (as a slow split job's may have): its inputs go, not the job's.
    assert purge(sessions, since=ended_at - HOUR, older_than=ended_at + HOUR) == 1
    assert kept(sessions) == {job.id, second}

    run_parts(sessions, [second])
    done = read(sessions, job.id)
    assert done.status == JobStatus.SUCCEEDED
    assert done.outputs is not None
    np.testing.assert_array_equal(tensors.unpack(done.outputs)["y"], x * 2)


def run_parts(sessions: Sessions, part_ids: list[str]) -> None:
    """Run parts as a worker's writer does: complete each (y = 2x of its samples), then settle."""
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=part_ids, owner="w", lease_s=60)
        results = [
            (lease, tensors.pack({"y": tensors.unpack(lease.inputs)["x"] * 2})) for lease in leases
        ]
        jobs.complete(session=session, results=results)
        parts.settle(session=session, parent_ids=[lease.parent_id for lease in leases])
