"""What the database knows of the object store (db/objects.py): uploads and the jobs that pin
them, and the garbage that rows leave behind when they go, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, objects, tenants
from db.clock import utcnow
from db.models import DEFAULT_TENANT, Job, JobInput, JobStatus, JobUpload, Upload
from tests.db.conftest import MakeJobs
from tffleet.errors import JobNotEnded, ServiceUnavailable
from tffleet.objectstore import keys

Sessions = sessionmaker[Session]

HOUR = timedelta(hours=1)


def upload(sessions: Sessions, *, tenant: str = DEFAULT_TENANT, expires_at: datetime) -> str:
    upload_id = keys.new_upload_id()
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=tenant)
        objects.create_upload(
            session=session,
            upload_id=upload_id,
            tenant=tenant,
            expires_at=expires_at,
            size=208,
            dtype="float32",
            shape=[2, 10],
        )
    return upload_id


def end(sessions: Sessions, job_id: str, *, at: datetime, stored: int | None = None) -> None:
    with sessions.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.SUCCEEDED.value, finished_at=at, stored_bytes=stored)
        )


def garbage(sessions: Sessions) -> list[tuple[str, bool]]:
    with sessions() as session:
        return [(g.key, g.prefix) for g in objects.take_garbage(session=session, limit=100)]


def test_an_upload_is_its_tenants_only(sessions: Sessions) -> None:
    upload_id = upload(sessions, tenant="acme", expires_at=utcnow() + HOUR)
    with sessions() as session:
        found = objects.get_upload(session=session, tenant="acme", upload_id=upload_id)
        assert found is not None
        assert found.key == f"acme/uploads/{upload_id}.npy"
        assert (found.size, found.dtype, found.shape) == (208, "float32", [2, 10])
        assert objects.get_upload(session=session, tenant="other", upload_id=upload_id) is None
        assert objects.get_upload(session=session, tenant="acme", upload_id="0" * 32) is None


def test_a_presigned_upload_is_described_once_checked(sessions: Sessions) -> None:
    upload_id = keys.new_upload_id()
    with sessions.begin() as session:
        objects.create_upload(
            session=session,
            upload_id=upload_id,
            tenant=DEFAULT_TENANT,
            expires_at=utcnow() + HOUR,
            size=None,
        )
    with sessions.begin() as session:
        objects.describe_upload(
            session=session, upload_id=upload_id, size=144, dtype="int64", shape=[2]
        )
    with sessions() as session:
        found = session.get(Upload, upload_id)
        assert found is not None
        assert (found.size, found.dtype, found.shape) == (144, "int64", [2])


def test_expired_uploads_go_unless_a_job_keeping_its_inputs_pins_them(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    young = upload(sessions, expires_at=now + HOUR)
    lone = upload(sessions, expires_at=now - HOUR)
    pinned = upload(sessions, expires_at=now - HOUR)
    released = upload(sessions, expires_at=now - HOUR)
    keeping, dropped = make_jobs(2)
    with sessions.begin() as session:
        objects.pin_uploads(session=session, job_id=keeping, upload_ids=[pinned, pinned])
        objects.pin_uploads(session=session, job_id=dropped, upload_ids=[released])
        # `dropped` ended and its inputs went (TFFLEET_INPUT_TTL_S): its pin holds no more.
        session.execute(JobInput.__table__.delete().where(JobInput.job_id == dropped))

    with sessions.begin() as session:
        assert objects.purge_uploads(session=session, now=now, limit=100) == 2

    with sessions() as session:
        assert set(session.scalars(select(Upload.id))) == {young, pinned}
        assert set(session.scalars(select(JobUpload.upload_id))) == {pinned}
    doomed = {keys.upload_key(DEFAULT_TENANT, lone), keys.upload_key(DEFAULT_TENANT, released)}
    assert sorted(garbage(sessions)) == sorted((key, False) for key in doomed)


def test_purged_and_deleted_jobs_that_own_objects_leave_their_prefix_as_garbage(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    old_owner, old_plain, removed, kept = make_jobs(4)
    end(sessions, old_owner, at=now - 30 * HOUR, stored=4096)
    end(sessions, old_plain, at=now - 30 * HOUR)
    end(sessions, removed, at=now, stored=0)
    end(sessions, kept, at=now, stored=10)

    with sessions.begin() as session:
        assert jobs.purge_finished(session=session, older_than=now - HOUR, limit=100) == 2
    with sessions.begin() as session:
        jobs.remove(session=session, job_id=removed)

    assert garbage(sessions) == [
        (keys.job_prefix(DEFAULT_TENANT, old_owner), True),
        (keys.job_prefix(DEFAULT_TENANT, removed), True),
    ]


def test_a_refused_delete_leaves_no_garbage(make_jobs: MakeJobs, sessions: Sessions) -> None:
    (queued,) = make_jobs(1)
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == queued).values(stored_bytes=8))
    with pytest.raises(JobNotEnded), sessions.begin() as session:
        jobs.remove(session=session, job_id=queued)
    assert garbage(sessions) == []


def test_dropped_inputs_leave_their_inputs_prefix_as_garbage(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    now = utcnow()
    owner, plain = make_jobs(2)
    end(sessions, owner, at=now - 2 * HOUR, stored=100)
    end(sessions, plain, at=now - 2 * HOUR)
    with sessions.begin() as session:
        purged = jobs.purge_inputs(
            session=session, since=now - 30 * HOUR, older_than=now - HOUR, limit=100
        )
    assert purged.deleted == 2
    assert garbage(sessions) == [(keys.job_prefix(DEFAULT_TENANT, owner) + "inputs/", True)]


def test_garbage_is_taken_in_chunks_and_forgotten(sessions: Sessions) -> None:
    with sessions.begin() as session:
        for n in range(5):
            objects.doom_prefix(session=session, prefix=f"t/jobs/{n}/")
    with sessions.begin() as session:
        first = objects.take_garbage(session=session, limit=3)
        assert [g.key for g in first] == [f"t/jobs/{n}/" for n in range(3)]
        objects.forget_garbage(session=session, ids=[g.id for g in first])
    assert garbage(sessions) == [("t/jobs/3/", True), ("t/jobs/4/", True)]


def test_stored_size_counts_jobs_and_uploads(make_jobs: MakeJobs, sessions: Sessions) -> None:
    with sessions() as session:
        assert objects.stored_size(session=session) == (0, 0)
    owner, _plain = make_jobs(2)
    end(sessions, owner, at=utcnow(), stored=1000)
    upload(sessions, expires_at=utcnow() + HOUR)  # 208 bytes
    with sessions() as session:
        assert objects.stored_size(session=session) == (2, 1208)


def test_written_ahead_garbage_waits_for_its_time_and_is_claimed_alone(sessions: Sessions) -> None:
    """A row written ahead of an object's write is due at `not_before` only; `claim` deletes it
    (never a doomed row of the same key), and `late` names those due within the margin."""
    soon, later = "t/uploads/soon.npy", "t/uploads/later.npy"
    with sessions.begin() as session:
        now = clock.now(session)
        objects.write_ahead(session=session, keys=[soon], not_before=now + timedelta(seconds=30))
        objects.write_ahead(session=session, keys=[later], not_before=now + HOUR)
        objects.doom_prefix(session=session, prefix="t/jobs/j/")
    with sessions() as session:
        taken = objects.take_garbage(session=session, limit=10, now=now)
        assert [g.key for g in taken] == ["t/jobs/j/"]
        due = objects.take_garbage(session=session, limit=10, now=now + 2 * HOUR)
        assert [g.key for g in due] == [soon, later, "t/jobs/j/"]
        # Due in 30 s is within the claim's margin: the sweeper may take it any moment now.
        assert objects.late(session=session, keys=[soon, later, "gone"]) == {soon, "gone"}
    with pytest.raises(ServiceUnavailable, match="TFFLEET_UPLOAD_GRACE_S"), sessions.begin() as s:
        objects.claim_in_time(session=s, keys=[soon])
    with sessions.begin() as session:
        objects.claim_in_time(session=session, keys=[later])
        objects.claim(session=session, keys=["t/jobs/j/"])  # a doomed row: not claimed
    with sessions() as session:
        left = objects.take_garbage(session=session, limit=10, now=now + 2 * HOUR)
        assert [(g.key, g.prefix) for g in left] == [(soon, False), ("t/jobs/j/", True)]


def test_rows_in_time_are_claimed_in_one_statement_that_names_them(sessions: Sessions) -> None:
    """`claim_those_in_time` deletes the written-ahead rows due past the margin and returns
    their keys; a row within the margin, a doomed row and an unknown key stay as they are."""
    soon, later, also = "t/jobs/a/inputs/x.npy", "t/jobs/b/inputs/x.npy", "t/uploads/c.npy"
    with sessions.begin() as session:
        now = clock.now(session)
        objects.write_ahead(session=session, keys=[soon], not_before=now + timedelta(seconds=30))
        objects.write_ahead(session=session, keys=[later, also], not_before=now + HOUR)
        objects.doom_prefix(session=session, prefix="t/jobs/j/")
    with sessions.begin() as session:
        claimed = objects.claim_those_in_time(
            session=session, keys=[soon, later, also, "t/jobs/j/", "gone"]
        )
        assert claimed == {later, also}
        assert objects.claim_those_in_time(session=session, keys=[]) == set()
    with sessions() as session:
        left = objects.take_garbage(session=session, limit=10, now=now + 2 * HOUR)
        assert [(g.key, g.prefix) for g in left] == [(soon, False), ("t/jobs/j/", True)]
