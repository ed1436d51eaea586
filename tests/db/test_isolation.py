"""Claims that keep a job lost before apart from the others (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from collections import Counter

from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import JobStatus
from tests.db.conftest import MakeJobs

Sessions = sessionmaker[Session]


def lose(sessions: Sessions, job_ids: list[str]) -> None:
    """Claim the jobs and hand them back, as after a lost worker: queued, attempts 1."""
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=job_ids, owner="dead", lease_s=60)
        jobs.release(session=session, leases=leases)


def status(sessions: Sessions, job_id: str) -> tuple[str, int]:
    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        return job.status, job.attempts


def test_still_queued_tells_the_named_jobs_never_claimed_from_those_claimed_before(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    fresh_a, retried, fresh_b, taken, canceled = make_jobs(5)
    lose(sessions, [retried])
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[taken], owner="other", lease_s=60)
        jobs.cancel(session=session, job_id=canceled)

    with sessions() as session:
        fresh, again = jobs.still_queued(
            session=session, job_ids=[fresh_b, canceled, retried, taken, fresh_a]
        )

    assert fresh == [fresh_a, fresh_b]
    assert again == [retried]
    assert status(sessions, retried) == (JobStatus.QUEUED, 1)  # reported, not claimed


def test_claim_next_fresh_never_tops_a_batch_up_with_a_job_lost_before(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    old, new = make_jobs(1, priority=9), make_jobs(2)
    lose(sessions, old)

    with sessions.begin() as session:
        leases = jobs.claim_next_fresh(
            session=session, model="m", version=1, owner="w1", lease_s=60, max_samples=10
        )

    assert [lease.job_id for lease in leases] == new
    assert status(sessions, old[0]) == (JobStatus.QUEUED, 1)


def retry_by_client(sessions: Sessions, job_id: str) -> None:
    """Run the job and cancel it, then `POST /v1/jobs/{id}/retry`: queued, attempts 1, a new run."""
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[job_id], owner="w0", lease_s=60)
        jobs.cancel(session=session, job_id=job_id)
    with sessions.begin() as session:
        jobs.retry(session=session, job_id=job_id)


def claim_fresh(sessions: Sessions) -> list[str]:
    with sessions.begin() as session:
        leases = jobs.claim_next_fresh(
            session=session, model="m", version=1, owner="w1", lease_s=60, max_samples=10
        )
    return [lease.job_id for lease in leases]


def test_a_job_a_client_retried_starts_a_new_run_and_batches_with_fresh_ones(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    retried, fresh_a, fresh_b = make_jobs(3)
    retry_by_client(sessions, retried)
    assert status(sessions, retried) == (JobStatus.QUEUED, 1)
    with sessions() as session:
        assert jobs.still_queued(session=session, job_ids=[retried]) == ([retried], [])

    assert claim_fresh(sessions) == [retried, fresh_a, fresh_b]
    assert status(sessions, retried) == (JobStatus.RUNNING, 2)


def test_a_retried_job_whose_lease_was_taken_back_runs_alone_again(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    retried, fresh = make_jobs(2)
    retry_by_client(sessions, retried)
    lose(sessions, [retried])  # claimed in its new run, then handed back: attempts 2
    with sessions() as session:
        assert jobs.still_queued(session=session, job_ids=[retried, fresh]) == (
            [fresh],
            [retried],
        )

    assert claim_fresh(sessions) == [fresh]
    with sessions.begin() as session:
        lease = jobs.claim_retried(session=session, job_ids=[retried], owner="w2", lease_s=60)
    assert lease is not None and lease.job_id == retried and lease.attempt == 3


def test_claim_retried_takes_one_job_at_a_time_oldest_first(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    first, second, fresh = make_jobs(3)
    lose(sessions, [first, second])

    taken = []
    while True:
        with sessions.begin() as session:
            lease = jobs.claim_retried(
                session=session, job_ids=[fresh, second, first], owner="w1", lease_s=60
            )
        if lease is None:
            break
        taken.append((lease.job_id, lease.attempt))

    assert taken == [(first, 2), (second, 2)]
    assert status(sessions, fresh) == (JobStatus.QUEUED, 0)


def test_racing_claims_of_fresh_and_retried_jobs_each_job_goes_to_exactly_one(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(60)
    lose(sessions, ids[::10])
    barrier = threading.Barrier(4)
    won: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def named(owner: str, order: list[str]) -> None:
        """As a message runs: batches of fresh jobs, then the named jobs lost before, alone."""
        try:
            barrier.wait(timeout=10)
            with sessions.begin() as session:
                leases = jobs.claim_next_fresh(
                    session=session, model="m", version=1, owner=owner, lease_s=60, max_samples=5
                )
            taken = [lease.job_id for lease in leases]
            while True:
                with sessions.begin() as session:
                    lease = jobs.claim_retried(
                        session=session, job_ids=order, owner=owner, lease_s=60
                    )
                if lease is None:
                    break
                taken.append(lease.job_id)
            won[owner] = taken
        except BaseException as exc:
            errors.append(exc)

    def top_up(owner: str) -> None:
        try:
            taken: list[str] = []
            barrier.wait(timeout=10)
            while True:
                with sessions.begin() as session:
                    leases = jobs.claim_next_fresh(
                        session=session, model="m", version=1, owner=owner, lease_s=60,
                        max_samples=7,
                    )  # fmt: skip
                if not leases:
                    break
                taken += [lease.job_id for lease in leases]
            won[owner] = taken
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=named, args=("n1", ids)),
        threading.Thread(target=named, args=("n2", ids[::-1])),
        threading.Thread(target=top_up, args=("t1",)),
        threading.Thread(target=top_up, args=("t2",)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    counts = Counter(job_id for taken in won.values() for job_id in taken)
    assert set(counts) == set(ids)
    assert set(counts.values()) == {1}
    lost_before = set(ids[::10])
    for owner in ("t1", "t2"):
        assert not lost_before & set(won[owner]), "a top-up took a job lost before"
