"""The job state machine, on SQLite and on PostgreSQL (every test runs on both)."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from datetime import UTC, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.clock import utcnow
from db.models import JobErrorCode, JobStatus
from tests.db.conftest import MakeJobs, read
from tffleet.errors import InvalidRequest, JobAlreadyFinished, JobNotFound

Sessions = sessionmaker[Session]


def claim(sessions: Sessions, job_ids: list[str], owner: str = "w1") -> list[jobs.Lease]:
    with sessions.begin() as session:
        return jobs.claim(session=session, job_ids=job_ids, owner=owner, lease_s=60)


def claim_next(sessions: Sessions, max_samples: int, owner: str = "w1") -> list[str]:
    """Claim queued jobs of model "m" version 1; returns their ids in the order claimed."""
    with sessions.begin() as session:
        leases = jobs.claim_next(
            session=session, model="m", version=1, owner=owner, lease_s=60, max_samples=max_samples
        )
    return [lease.job_id for lease in leases]


# create / get


def test_create_then_get_returns_the_queued_job(sessions: Sessions) -> None:
    with sessions.begin() as session:
        (row,) = jobs.create(
            session=session,
            jobs=[jobs.NewJob(model="m", version=3, samples=4, inputs=b"x", priority=7)],
        )
    job = read(sessions, row.id)
    assert (job.model, job.version, job.samples, job.priority) == ("m", 3, 4, 7)
    assert job.status == JobStatus.QUEUED
    assert job.attempts == 0
    assert job.lease_owner is None and job.started_at is None and job.finished_at is None
    assert job.created_at.tzinfo == UTC


def test_job_ids_are_uuid7_and_sort_in_creation_order(make_jobs: MakeJobs) -> None:
    ids = make_jobs(200) + make_jobs(50)
    assert all(uuid.UUID(job_id).version == 7 for job_id in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_get_unknown_job_raises_job_not_found(sessions: Sessions) -> None:
    with sessions() as session, pytest.raises(JobNotFound, match="nope"):
        jobs.get(session=session, job_id="nope")


def test_get_many_returns_the_known_jobs_only(make_jobs: MakeJobs, sessions: Sessions) -> None:
    ids = make_jobs(3)
    with sessions() as session:
        found = jobs.get_many(session=session, job_ids=[*ids, str(uuid.uuid4())])
        assert jobs.get_many(session=session, job_ids=[]) == []
    assert sorted(job.id for job in found) == sorted(ids)


def test_get_sees_changes_made_by_the_state_machine_in_the_same_session(
    sessions: Sessions,
) -> None:
    with sessions() as session:
        (row,) = jobs.create(
            session=session, jobs=[jobs.NewJob(model="m", version=1, samples=1, inputs=b"")]
        )
        session.commit()
        jobs.claim(session=session, job_ids=[row.id], owner="w1", lease_s=60)
        session.commit()
        assert jobs.get(session=session, job_id=row.id).status == JobStatus.RUNNING
        assert jobs.get_many(session=session, job_ids=[row.id])[0].attempts == 1


# claim


def test_claim_moves_a_queued_job_to_running_under_a_lease(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    before = utcnow()
    (lease,) = claim(sessions, [job_id], owner="w1")
    assert (lease.job_id, lease.owner, lease.attempt, lease.samples) == (job_id, "w1", 1, 1)
    assert lease.inputs == b"in"
    job = read(sessions, job_id)
    assert job.status == JobStatus.RUNNING
    assert job.attempts == 1
    assert job.lease_owner == "w1"
    assert job.worker == "w1"
    assert job.started_at is not None and job.started_at >= before - timedelta(seconds=1)
    assert job.lease_expires_at is not None
    assert timedelta(seconds=55) < job.lease_expires_at - before < timedelta(seconds=65)


def test_claim_of_an_already_claimed_job_returns_nothing(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    claim(sessions, [job_id], owner="w1")
    assert claim(sessions, [job_id], owner="w2") == []
    assert read(sessions, job_id).lease_owner == "w1"


def test_claim_returns_leases_in_the_order_asked_and_skips_unknown_ids(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(4)
    asked = [ids[2], str(uuid.uuid4()), ids[0], ids[3]]
    assert [lease.job_id for lease in claim(sessions, asked)] == [ids[2], ids[0], ids[3]]
    assert claim(sessions, []) == []


def test_racing_claimers_each_job_goes_to_exactly_one(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(60)
    claimers = 4
    barrier = threading.Barrier(claimers)
    won: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def run(owner: str, order: list[str]) -> None:
        try:
            with sessions() as session:
                barrier.wait(timeout=10)
                leases = jobs.claim(session=session, job_ids=order, owner=owner, lease_s=60)
                session.commit()
            won[owner] = [lease.job_id for lease in leases]
        except BaseException as exc:
            errors.append(exc)

    orders = [ids, ids[::-1], random.Random(1).sample(ids, len(ids)), ids[30:] + ids[:30]]
    threads = [threading.Thread(target=run, args=(f"w{i}", orders[i])) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    counts = Counter(job_id for taken in won.values() for job_id in taken)
    assert set(counts) == set(ids)
    assert set(counts.values()) == {1}
    for owner, taken in won.items():
        assert all(read(sessions, job_id).lease_owner == owner for job_id in taken[:3])


def test_racing_claim_next_callers_each_job_goes_to_exactly_one(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(80)
    claimers = 4
    barrier = threading.Barrier(claimers)
    won: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def run(owner: str) -> None:
        try:
            taken: list[str] = []
            barrier.wait(timeout=10)
            while batch := claim_next(sessions, 7, owner=owner):
                taken += batch
            won[owner] = taken
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    counts = Counter(job_id for taken in won.values() for job_id in taken)
    assert set(counts) == set(ids)
    assert set(counts.values()) == {1}


# claim_next


def test_claim_next_takes_higher_priority_first_then_older(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    old_low = make_jobs(2, priority=0)
    high = make_jobs(2, priority=5)
    new_low = make_jobs(2, priority=0)
    assert claim_next(sessions, 3) == [*high, old_low[0]]
    assert claim_next(sessions, 10) == [old_low[1], *new_low]


def test_claim_next_takes_only_the_named_model_version(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    make_jobs(2, model="other")
    make_jobs(2, version=2)
    mine = make_jobs(2)
    assert claim_next(sessions, 10) == mine


def test_claim_next_stays_within_max_samples(make_jobs: MakeJobs, sessions: Sessions) -> None:
    first = make_jobs(2, samples=3)
    big = make_jobs(1, samples=5)
    small = make_jobs(1, samples=2)
    # 3 + 3 = 6; the 5 does not fit in the 4 left, the 2 after it does.
    assert claim_next(sessions, 10) == [*first, *small]
    assert claim_next(sessions, 10) == big


def test_claim_next_takes_a_job_larger_than_max_samples_alone(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    big = make_jobs(1, samples=50)
    rest = make_jobs(3, samples=1)
    assert claim_next(sessions, 8) == big
    assert claim_next(sessions, 8) == rest


def test_claim_next_with_no_room_or_no_jobs_claims_nothing(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    assert claim_next(sessions, 10) == []
    make_jobs(2)
    assert claim_next(sessions, 0) == []
    assert len(claim_next(sessions, 10)) == 2


# complete, fail, release: fenced by (owner, attempt)


def test_complete_writes_outputs_under_the_matching_lease(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"out")]) == 1
    job = read(sessions, job_id)
    assert job.status == JobStatus.SUCCEEDED
    assert job.outputs == b"out"
    assert job.finished_at is not None and job.finished_at.tzinfo == UTC
    assert job.lease_owner is None and job.lease_expires_at is None


def test_complete_by_a_stale_owner_writes_nothing(make_jobs: MakeJobs, sessions: Sessions) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id], owner="w1")
    impostor = jobs.Lease(job_id, "w2", lease.attempt, lease.samples, lease.priority, b"")
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(impostor, b"bad")]) == 0
    job = read(sessions, job_id)
    assert job.status == JobStatus.RUNNING and job.outputs is None


def test_complete_under_an_old_attempt_writes_nothing(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    (first,) = claim(sessions, [job_id], owner="w1")
    with sessions.begin() as session:
        jobs.release(session=session, leases=[first])
    (second,) = claim(sessions, [job_id], owner="w1")  # same owner, next attempt
    assert second.attempt == first.attempt + 1
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(first, b"late")]) == 0
        assert (
            jobs.fail(session=session, leases=[first], code=JobErrorCode.TIMEOUT, message="late")
            == 0
        )
    assert read(sessions, job_id).status == JobStatus.RUNNING
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(second, b"ok")]) == 1
    assert read(sessions, job_id).outputs == b"ok"


def test_complete_counts_only_the_results_it_wrote(make_jobs: MakeJobs, sessions: Sessions) -> None:
    ids = make_jobs(3)
    leases = claim(sessions, ids)
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=ids[1])
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"o") for lease in leases]) == 2
    assert [read(sessions, i).status for i in ids] == ["succeeded", "canceled", "succeeded"]
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[]) == 0


def test_a_second_complete_of_the_same_lease_writes_nothing(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"first")]) == 1
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"second")]) == 0
    assert read(sessions, job_id).outputs == b"first"


def test_fail_ends_the_job_with_its_error_code_and_message(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(2)
    leases = claim(sessions, ids)
    with sessions.begin() as session:
        count = jobs.fail(
            session=session, leases=leases, code=JobErrorCode.INVALID_INPUT, message="inputs.x: bad"
        )
        assert count == 2
    for job_id in ids:
        job = read(sessions, job_id)
        assert job.status == JobStatus.FAILED
        assert (job.error_code, job.error_message) == ("invalid_input", "inputs.x: bad")
        assert job.finished_at is not None and job.outputs is None
        assert job.lease_owner is None


def test_release_returns_the_job_to_the_queue_for_a_next_attempt(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id], owner="w1")
    with sessions.begin() as session:
        assert jobs.release(session=session, leases=[lease]) == 1
    job = read(sessions, job_id)
    assert job.status == JobStatus.QUEUED
    assert job.lease_owner is None and job.lease_expires_at is None
    assert job.attempts == 1
    with sessions.begin() as session:
        assert jobs.release(session=session, leases=[lease]) == 0  # no longer held
    (again,) = claim(sessions, [job_id], owner="w2")
    assert (again.owner, again.attempt) == ("w2", 2)


# heartbeat


def test_heartbeat_extends_only_the_leases_still_held(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    held_id, released_id, done_id = make_jobs(3)
    held, released, done = claim(sessions, [held_id, released_id, done_id])
    with sessions.begin() as session:
        jobs.release(session=session, leases=[released])
        jobs.complete(session=session, results=[(done, b"o")])
    impostor = jobs.Lease(held_id, "w2", held.attempt, 1, 0, b"")
    old_expiry = read(sessions, held_id).lease_expires_at
    assert old_expiry is not None
    with sessions.begin() as session:
        count = jobs.heartbeat(
            session=session, leases=[held, released, done, impostor], lease_s=3600
        )
        assert count == 1
    new_expiry = read(sessions, held_id).lease_expires_at
    assert new_expiry is not None and new_expiry.tzinfo == UTC
    assert new_expiry - old_expiry > timedelta(seconds=3000)
    assert read(sessions, released_id).lease_expires_at is None
    assert read(sessions, done_id).lease_expires_at is None
    with sessions.begin() as session:
        assert jobs.heartbeat(session=session, leases=[], lease_s=60) == 0


# cancel


def test_cancel_of_a_queued_job_cancels_it_and_it_is_never_claimed(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    with sessions.begin() as session:
        job = jobs.cancel(session=session, job_id=job_id)
        assert job.status == JobStatus.CANCELED
        assert job.finished_at is not None
    assert read(sessions, job_id).status == JobStatus.CANCELED
    assert claim(sessions, [job_id]) == []
    assert claim_next(sessions, 10) == []


def test_cancel_of_a_running_job_fences_out_its_late_result(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        assert jobs.cancel(session=session, job_id=job_id).status == JobStatus.CANCELED
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"late")]) == 0
        assert (
            jobs.fail(session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="x")
            == 0
        )
        assert jobs.release(session=session, leases=[lease]) == 0
        assert jobs.heartbeat(session=session, leases=[lease], lease_s=60) == 0
    job = read(sessions, job_id)
    assert job.status == JobStatus.CANCELED
    assert job.outputs is None and job.error_code is None and job.lease_owner is None


def test_cancel_twice_is_not_an_error(make_jobs: MakeJobs, sessions: Sessions) -> None:
    (job_id,) = make_jobs()
    with sessions.begin() as session:
        first = jobs.cancel(session=session, job_id=job_id)
    with sessions.begin() as session:
        second = jobs.cancel(session=session, job_id=job_id)
    assert second.status == JobStatus.CANCELED
    assert second.finished_at == first.finished_at


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_cancel_of_a_finished_job_raises_job_already_finished(
    make_jobs: MakeJobs, sessions: Sessions, outcome: str
) -> None:
    (job_id,) = make_jobs()
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        if outcome == "succeeded":
            jobs.complete(session=session, results=[(lease, b"o")])
        else:
            jobs.fail(
                session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="boom"
            )
    with sessions() as session, pytest.raises(JobAlreadyFinished, match=outcome):
        jobs.cancel(session=session, job_id=job_id)
    assert read(sessions, job_id).status == outcome


def test_cancel_of_an_unknown_job_raises_job_not_found(sessions: Sessions) -> None:
    with sessions() as session, pytest.raises(JobNotFound):
        jobs.cancel(session=session, job_id=str(uuid.uuid4()))


# list_jobs


def page_through(
    sessions: Sessions,
    limit: int,
    status: JobStatus | None = None,
    model: str | None = None,
) -> list[list[str]]:
    """Every page of ids, following next_cursor until it is None."""
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        with sessions() as session:
            found, cursor = jobs.list_jobs(
                session=session, status=status, model=model, limit=limit, cursor=cursor
            )
        pages.append([job.id for job in found])
        if cursor is None:
            return pages
        assert len(pages) < 100, "paging does not end"


@pytest.mark.parametrize("limit", [1, 4, 5, 23, 100])
def test_list_jobs_pages_cover_every_job_once_newest_first(
    make_jobs: MakeJobs, sessions: Sessions, limit: int
) -> None:
    ids = make_jobs(20)
    pages = page_through(sessions, limit)
    listed = [job_id for page in pages for job_id in page]
    assert listed == ids[::-1]
    assert all(len(page) == limit for page in pages[:-1])
    assert 1 <= len(pages[-1]) <= limit or (len(pages) == 1 and not pages[0])


def test_list_jobs_filters_by_status_and_model(make_jobs: MakeJobs, sessions: Sessions) -> None:
    a = make_jobs(5, model="a")
    b = make_jobs(4, model="b")
    claim(sessions, [a[0], a[1], b[0]])
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=a[4])

    def listed(status: JobStatus | None = None, model: str | None = None) -> list[str]:
        pages = page_through(sessions, 2, status=status, model=model)
        return [job_id for page in pages for job_id in page]

    assert listed(model="a") == a[::-1]
    assert listed(status=JobStatus.RUNNING) == [b[0], a[1], a[0]]
    assert listed(status=JobStatus.QUEUED, model="a") == [a[3], a[2]]
    assert listed(status=JobStatus.CANCELED, model="b") == []
    assert listed(model="nobody") == []


def test_list_jobs_reads_a_cursor_in_any_uuid_spelling(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    ids = make_jobs(5)
    with sessions() as session:
        _, cursor = jobs.list_jobs(session=session, limit=2)
        assert cursor == ids[3]
        for spelling in (cursor.upper(), cursor.replace("-", ""), "{" + cursor + "}"):
            found, _ = jobs.list_jobs(session=session, limit=2, cursor=spelling)
            assert [job.id for job in found] == [ids[2], ids[1]]


@pytest.mark.parametrize("cursor", ["garbage", "'; drop table jobs; --", ""])
def test_list_jobs_rejects_a_cursor_it_did_not_hand_out(sessions: Sessions, cursor: str) -> None:
    with sessions() as session, pytest.raises(InvalidRequest, match="cursor"):
        jobs.list_jobs(session=session, cursor=cursor)


@pytest.mark.parametrize("limit", [0, -1])
def test_list_jobs_rejects_a_limit_below_one(sessions: Sessions, limit: int) -> None:
    with sessions() as session, pytest.raises(InvalidRequest, match="limit"):
        jobs.list_jobs(session=session, limit=limit)
