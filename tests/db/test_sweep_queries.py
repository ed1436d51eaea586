"""The sweeper's queries, on SQLite and on PostgreSQL (every test runs on both)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.clock import utcnow
from db.models import Job, JobStatus
from tests.db.conftest import MakeJobs

Sessions = sessionmaker[Session]

LATER = timedelta(seconds=61)  # past the 60 s leases these tests take


def read(sessions: Sessions, job_id: str) -> Job:
    with sessions() as session:
        return jobs.get(session=session, job_id=job_id)


def claim(sessions: Sessions, job_ids: list[str], owner: str = "w1") -> list[jobs.Lease]:
    with sessions.begin() as session:
        return jobs.claim(session=session, job_ids=job_ids, owner=owner, lease_s=60)


def expire(sessions: Sessions, *, now: datetime, max_attempts: int = 3) -> jobs.TakenBack:
    with sessions.begin() as session:
        return jobs.expire_leases(session=session, now=now, max_attempts=max_attempts)


def complete(sessions: Sessions, lease: jobs.Lease) -> int:
    with sessions.begin() as session:
        return jobs.complete(session=session, results=[(lease, b"out")])


def finish_at(sessions: Sessions, job_id: str, status: JobStatus, at: datetime) -> None:
    with sessions.begin() as session:
        job = jobs.get(session=session, job_id=job_id)
        job.status, job.finished_at = status.value, at


# expire_leases


def test_expired_leases_go_back_to_the_queue_grouped_by_model_version(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    a = make_jobs(2, model="a")
    b = make_jobs(1, model="b", version=2)
    claim(sessions, a + b)

    expired = expire(sessions, now=utcnow() + LATER)

    assert expired.requeued == {("a", 1): a, ("b", 2): b}
    assert expired.failed == []
    assert expired.count == 3
    for job_id in a + b:
        job = read(sessions, job_id)
        assert job.status == JobStatus.QUEUED
        assert job.lease_owner is None and job.lease_expires_at is None
        assert job.attempts == 1


def test_leases_not_yet_expired_and_jobs_not_running_are_left_alone(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    running, queued = make_jobs(2)
    (lease,) = claim(sessions, [running])

    assert expire(sessions, now=utcnow()).count == 0
    assert read(sessions, running).lease_owner == "w1"
    assert read(sessions, queued).status == JobStatus.QUEUED
    assert complete(sessions, lease) == 1


def test_a_job_that_used_its_attempt_budget_fails_as_worker_lost(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    now = utcnow()
    for attempt in (1, 2):
        claim(sessions, [job_id], owner=f"w{attempt}")
        now += LATER
        assert expire(sessions, now=now, max_attempts=3).requeued == {("m", 1): [job_id]}
    claim(sessions, [job_id], owner="w3")
    now += LATER

    expired = expire(sessions, now=now, max_attempts=3)

    assert expired.requeued == {}
    assert expired.failed == [job_id]
    job = read(sessions, job_id)
    assert job.status == JobStatus.FAILED
    assert job.error_code == "worker_lost"
    assert job.error_message is not None and "lost 3 times" in job.error_message
    assert job.finished_at is not None and job.lease_owner is None
    assert claim(sessions, [job_id], owner="w4") == []


def test_one_sweep_requeues_some_and_fails_others(make_jobs: MakeJobs, sessions: Sessions) -> None:
    fresh, poison = make_jobs(2)
    claim(sessions, [poison])
    expire(sessions, now=utcnow() + LATER)
    claim(sessions, [fresh, poison])  # poison: its second attempt

    expired = expire(sessions, now=utcnow() + LATER, max_attempts=2)

    assert expired.requeued == {("m", 1): [fresh]}
    assert expired.failed == [poison]


def test_a_late_complete_after_the_lease_was_taken_back_is_fenced_out(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    (stale,) = claim(sessions, [job_id], owner="w1")
    expire(sessions, now=utcnow() + LATER)

    assert complete(sessions, stale) == 0  # requeued: nobody holds it
    (fresh,) = claim(sessions, [job_id], owner="w2")
    assert complete(sessions, stale) == 0  # held again, by attempt 2
    assert complete(sessions, fresh) == 1

    job = read(sessions, job_id)
    assert (job.status, job.attempts, job.worker) == (JobStatus.SUCCEEDED, 2, "w2")


def test_a_result_written_before_the_sweep_stands(make_jobs: MakeJobs, sessions: Sessions) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id])
    assert complete(sessions, lease) == 1

    assert expire(sessions, now=utcnow() + LATER).count == 0
    assert read(sessions, job_id).status == JobStatus.SUCCEEDED


def test_a_heartbeat_keeps_the_lease_from_expiring(make_jobs: MakeJobs, sessions: Sessions) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        jobs.heartbeat(session=session, leases=[lease], lease_s=600)

    assert expire(sessions, now=utcnow() + LATER).count == 0
    assert complete(sessions, lease) == 1


def test_expire_leases_takes_at_most_limit_jobs_per_call(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(5)
    claim(sessions, ids)
    now = utcnow() + LATER
    with sessions.begin() as session:
        first = jobs.expire_leases(session=session, now=now, max_attempts=3, limit=3)
    rest = expire(sessions, now=now)

    assert first.requeued == {("m", 1): ids[:3]}
    assert rest.requeued == {("m", 1): ids[3:]}


def test_racing_completes_and_a_sweep_end_each_job_exactly_once(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(40)
    leases = claim(sessions, ids)
    barrier = threading.Barrier(2)
    written: list[int] = []
    expired: list[jobs.TakenBack] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=10)
            written.extend(complete(sessions, lease) for lease in leases)
        except BaseException as exc:
            errors.append(exc)

    def sweeper() -> None:
        try:
            barrier.wait(timeout=10)
            expired.append(expire(sessions, now=utcnow() + LATER))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker), threading.Thread(target=sweeper)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    requeued = set(expired[0].requeued.get(("m", 1), []))
    completed = {lease.job_id for lease, n in zip(leases, written, strict=True) if n == 1}
    assert requeued.isdisjoint(completed)
    assert requeued | completed == set(ids)
    for job_id in ids:
        status = read(sessions, job_id).status
        assert status == (JobStatus.SUCCEEDED if job_id in completed else JobStatus.QUEUED)


# stale_queued, mark_published


def test_stale_queued_finds_jobs_whose_wakeup_is_older_than_the_cutoff(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    a = make_jobs(2, model="a")
    b = make_jobs(1, model="b", version=3)
    with sessions() as session:
        assert jobs.stale_queued(session=session, older_than=utcnow() - LATER, limit=10) == {}
        found = jobs.stale_queued(session=session, older_than=utcnow() + LATER, limit=10)
    assert found == {("a", 1): a, ("b", 3): b}


def test_stale_queued_skips_jobs_that_are_running_or_finished(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    running, canceled, queued = make_jobs(3)
    claim(sessions, [running])
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=canceled)
        found = jobs.stale_queued(session=session, older_than=utcnow() + LATER, limit=10)
    assert found == {("m", 1): [queued]}


def test_stale_queued_returns_the_oldest_jobs_first_up_to_limit(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(5)
    with sessions() as session:
        found = jobs.stale_queued(session=session, older_than=utcnow() + LATER, limit=3)
    assert found == {("m", 1): ids[:3]}


def test_a_job_marked_published_is_stale_again_only_after_the_cutoff_passes_it(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    marked, unmarked = make_jobs(2)
    at = utcnow() + timedelta(seconds=30)
    with sessions.begin() as session:
        assert jobs.mark_published(session=session, job_ids=[marked], at=at) == 1
        assert jobs.mark_published(session=session, job_ids=[], at=at) == 0

    with sessions() as session:
        before = jobs.stale_queued(session=session, older_than=at, limit=10)
        after = jobs.stale_queued(session=session, older_than=at + timedelta(seconds=1), limit=10)
    assert before == {("m", 1): [unmarked]}
    assert after == {("m", 1): [marked, unmarked]}
    published_at = read(sessions, marked).published_at
    assert published_at is not None and abs(published_at - at) < timedelta(milliseconds=1)


def test_mark_published_leaves_jobs_that_left_the_queue(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    claim(sessions, [job_id])
    with sessions.begin() as session:
        assert jobs.mark_published(session=session, job_ids=[job_id], at=utcnow()) == 0
    assert read(sessions, job_id).published_at is None


# purge_finished


def test_purge_deletes_only_finished_jobs_that_ended_before_the_cutoff(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    old_ok, old_failed, old_canceled, young_ok, queued, running = make_jobs(6)
    finish_at(sessions, old_ok, JobStatus.SUCCEEDED, now - timedelta(days=8))
    finish_at(sessions, old_failed, JobStatus.FAILED, now - timedelta(days=8))
    finish_at(sessions, old_canceled, JobStatus.CANCELED, now - timedelta(days=8))
    finish_at(sessions, young_ok, JobStatus.SUCCEEDED, now - timedelta(days=6))
    claim(sessions, [running])

    with sessions.begin() as session:
        purged = jobs.purge_finished(session=session, older_than=now - timedelta(days=7), limit=100)

    assert purged == 3
    with sessions() as session:
        left = jobs.get_many(
            session=session, job_ids=[old_ok, old_failed, old_canceled, young_ok, queued, running]
        )
    assert sorted(job.id for job in left) == sorted([young_ok, queued, running])


def test_purge_works_in_chunks_of_at_most_limit(make_jobs: MakeJobs, sessions: Sessions) -> None:
    now = utcnow()
    ids = make_jobs(5)
    for job_id in ids:
        finish_at(sessions, job_id, JobStatus.SUCCEEDED, now - timedelta(days=8))

    chunks = []
    while True:
        with sessions.begin() as session:
            purged = jobs.purge_finished(session=session, older_than=now, limit=2)
        if not purged:
            break
        chunks.append(purged)

    assert chunks == [2, 2, 1]


def test_a_job_with_its_own_ttl_is_purged_after_it_and_not_by_the_default(
    sessions: Sessions,
) -> None:
    now = utcnow()
    with sessions.begin() as session:
        short, long_kept = (
            job.id
            for job in jobs.create(
                session=session,
                jobs=[
                    jobs.NewJob(model="m", version=1, samples=1, inputs=b"x", ttl_s=60),
                    jobs.NewJob(model="m", version=1, samples=1, inputs=b"x", ttl_s=30 * 86400),
                ],
            )
        )
    finish_at(sessions, short, JobStatus.SUCCEEDED, now - timedelta(minutes=2))
    finish_at(sessions, long_kept, JobStatus.SUCCEEDED, now - timedelta(days=8))

    with sessions.begin() as session:
        assert jobs.stamp_expiry(session=session, limit=100) == 2
    with sessions.begin() as session:
        purged = jobs.purge_finished(
            session=session, older_than=now - timedelta(days=7), limit=100, now=now
        )

    assert purged == 1  # the short one; the default's 7 days do not apply to the long one
    expires = read(sessions, long_kept).expires_at
    assert expires is not None and expires > now + timedelta(days=21)
    with sessions() as session:
        assert [job.id for job in jobs.get_many(session=session, job_ids=[short, long_kept])] == [
            long_kept
        ]
