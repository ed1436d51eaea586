"""What the database knows of the object store (DESIGN §13): uploads, the jobs that pin them,
and the store's garbage.

The store holds no record of its own: every object is named by a row here, and goes only after
that row. Whoever deletes rows that name objects inserts, in the same transaction, what to
delete into `object_garbage` (`doom_jobs`, `doom_prefix`, `purge_uploads`); the sweeper then
deletes those objects from the store and, once the store has, the garbage rows
(`take_garbage`, `forget_garbage`; worker/garbage.py). A store that does not answer leaves the
rows for the next sweep, and an object is never deleted while a row still points at it.

- An upload (`create_upload`) is kept until its `expires_at` (TFFLEET_UPLOAD_TTL_S), and past it
  while a job that names it (`pin_uploads`) still keeps its inputs: a retry reads it again.
- A job that owns objects (a large input at submit, a large output from the worker) has
  `stored_bytes` not null; its objects all lie under `<tenant>/jobs/<id>/`.
- The API writes an object (an upload, a large input) before the row that names it is
  committed: it first names the object as garbage due at `not_before`, TFFLEET_UPLOAD_GRACE_S
  later, committed on its own (`write_ahead`), and the transaction that commits the row deletes
  that garbage row (`claim`). An API that dies in between leaves garbage, not an orphan; a row
  committed once its garbage row is due is refused (`late`), as the sweeper may be deleting it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Table, bindparam, delete, exists, func, insert, or_, select, update
from sqlalchemy.orm import Session

from db import clock
from db.models import Job, JobInput, JobUpload, ObjectGarbage, Upload
from tffleet.errors import ServiceUnavailable
from tffleet.objectstore import keys

_jobs: Table = Job.__table__  # type: ignore[assignment]
_inputs: Table = JobInput.__table__  # type: ignore[assignment]
_uploads: Table = Upload.__table__  # type: ignore[assignment]
_pins: Table = JobUpload.__table__  # type: ignore[assignment]
_garbage: Table = ObjectGarbage.__table__  # type: ignore[assignment]

# The statements of every submission that writes ahead, built once: building one costs more
# than SQLite takes to run it (0.2 ms against 0.05 here).
_WRITE_AHEAD = insert(_garbage)
_IN_TIME = (
    _garbage.c.key.in_(bindparam("keys", expanding=True)),
    _garbage.c.not_before > bindparam("due"),
)
_CLAIM_IN_TIME = delete(_garbage).where(*_IN_TIME).returning(_garbage.c.key)
_CLAIMABLE = select(_garbage.c.key).where(*_IN_TIME)


# ─── Uploads ──────────────────────────────────────────────────────────────────────────────────────


def create_upload(
    *,
    session: Session,
    upload_id: str,
    tenant: str,
    expires_at: datetime,
    size: int | None,
    dtype: str | None = None,
    shape: Sequence[int] | None = None,
    members: dict[str, dict[str, object]] | None = None,
    written_ahead: bool = False,
) -> Upload:
    """Record an upload whose object is (or, presigned, will be) at `keys.upload_key`. `size`
    null: a presigned PUT not yet checked (`describe_upload` does, at its first reference).
    `members`: an .npz's arrays (api/npz_uploads.py), its key's extension .npz.
    `written_ahead`: the API wrote its object first, named as garbage (`write_ahead`), which
    this claims: 503 where that row is (nearly) due."""
    upload = Upload(
        id=upload_id,
        tenant=tenant,
        key=keys.upload_key(tenant, upload_id, "npy" if members is None else "npz"),
        size=size,
        dtype=dtype,
        shape=None if shape is None else list(shape),
        members=members,
        created_at=clock.now(session),
        expires_at=expires_at,
    )
    if written_ahead:
        claim_in_time(session=session, keys=[upload.key])
    session.add(upload)
    session.flush()
    return upload


def get_upload(*, session: Session, tenant: str, upload_id: str) -> Upload | None:
    """The tenant's upload, or None: unknown, or another tenant's (which is no different)."""
    upload = session.get(Upload, upload_id)
    return upload if upload is not None and upload.tenant == tenant else None


def describe_upload(
    *, session: Session, upload_id: str, size: int, dtype: str, shape: Sequence[int]
) -> None:
    """Record what a presigned upload turned out to hold, read from its object's header."""
    session.execute(
        update(_uploads)
        .where(_uploads.c.id == upload_id)
        .values(size=size, dtype=dtype, shape=list(shape))
    )


def pin_uploads(*, session: Session, job_id: str, upload_ids: Iterable[str]) -> None:
    """Pin uploads to a job that names them, in the transaction that creates the job: they stay
    while it keeps its inputs."""
    rows = [{"job_id": job_id, "upload_id": upload_id} for upload_id in sorted(set(upload_ids))]
    if rows:
        session.execute(insert(_pins), rows)


def purge_uploads(*, session: Session, now: datetime, limit: int) -> int:
    """Delete at most `limit` uploads past `expires_at` that no job keeping its inputs pins, and
    name their objects as garbage; returns how many."""
    pinned = exists().where(
        _pins.c.upload_id == _uploads.c.id,
        exists().where(_inputs.c.job_id == _pins.c.job_id),
    )
    rows = session.execute(
        select(_uploads.c.id, _uploads.c.key)
        .where(_uploads.c.expires_at < now, ~pinned)
        .order_by(_uploads.c.expires_at)
        .limit(limit)
    ).all()
    if not rows:
        return 0
    ids = [row.id for row in rows]
    _doom(session, [(row.key, False) for row in rows], now)
    session.execute(delete(_pins).where(_pins.c.upload_id.in_(ids)))
    session.execute(delete(_uploads).where(_uploads.c.id.in_(ids)))
    return len(rows)


# ─── Garbage ──────────────────────────────────────────────────────────────────────────────────────


class Garbage(NamedTuple):
    id: int
    key: str
    prefix: bool  # every object under `key`, not the one object named so


def doom_jobs(*, session: Session, job_ids: Sequence[str]) -> int:
    """Name the store prefix of each of these jobs (and of their parts) that owns objects as
    garbage, before the caller deletes their rows in the same transaction; returns how many."""
    if not job_ids:
        return 0
    rows = session.execute(
        select(_jobs.c.tenant, _jobs.c.id).where(
            or_(_jobs.c.id.in_(job_ids), _jobs.c.parent_id.in_(job_ids)),
            _jobs.c.stored_bytes.is_not(None),
        )
    ).all()
    _doom(session, [(keys.job_prefix(row.tenant, row.id), True) for row in rows])
    return len(rows)


def doom_inputs(*, session: Session, job_ids: Sequence[str]) -> int:
    """Name the `inputs/` prefix of each of these jobs that owns objects as garbage, before the
    caller deletes their `job_inputs` rows; returns how many."""
    if not job_ids:
        return 0
    rows = session.execute(
        select(_jobs.c.tenant, _jobs.c.id).where(
            _jobs.c.id.in_(job_ids), _jobs.c.stored_bytes.is_not(None)
        )
    ).all()
    _doom(session, [(keys.job_prefix(row.tenant, row.id) + "inputs/", True) for row in rows])
    return len(rows)


def doom_prefix(*, session: Session, prefix: str) -> None:
    """Name every object under `prefix` as garbage (a job's `inputs/` when they go)."""
    _doom(session, [(prefix, True)])


def _doom(session: Session, found: Sequence[tuple[str, bool]], now: datetime | None = None) -> None:
    if found:
        at = now or clock.now(session)
        session.execute(
            insert(_garbage),
            [{"key": key, "prefix": prefix, "created_at": at} for key, prefix in found],
        )


# A written-ahead row is claimed only while it is due this much later at least: a sweep that
# took it (its `not_before` passed) is never deleting the object as the row naming it commits.
CLAIM_MARGIN = timedelta(seconds=60)


def write_ahead(*, session: Session, keys: Sequence[str], not_before: datetime) -> None:
    """Name objects about to be written as garbage due at `not_before`, in a transaction of its
    own committed before the write: should the row that is to name them never be committed
    (the API died, the request failed), the sweeper deletes them once that time has passed."""
    rows = [
        {"key": key, "prefix": False, "created_at": clock.now(session), "not_before": not_before}
        for key in keys
    ]
    if rows:
        session.execute(_WRITE_AHEAD, rows)


def late(*, session: Session, keys: Sequence[str]) -> set[str]:
    """Those of `keys` whose written-ahead rows are gone or (nearly) due: the sweeper may be
    deleting their objects, so no row may come to name them."""
    if not keys:
        return set()
    due = clock.now(session) + CLAIM_MARGIN
    claimable = session.execute(_CLAIMABLE, {"keys": list(set(keys)), "due": due}).scalars()
    return set(keys) - set(claimable)


def too_late(count: int) -> ServiceUnavailable:
    """503 for a request whose objects took longer than TFFLEET_UPLOAD_GRACE_S to be stored."""
    return ServiceUnavailable(
        f"{count} object(s) of this request took longer than TFFLEET_UPLOAD_GRACE_S to be "
        "stored and may be deleted already; send the request again"
    )


def claim_in_time(*, session: Session, keys: Sequence[str]) -> None:
    """`claim`, or 503 (`too_late`) where a written-ahead row is gone or (nearly) due: one
    statement. The caller's transaction must then roll back (it ends in the 503), which keeps
    the rows it claimed of the others."""
    wanted = set(keys)
    claimed = claim_those_in_time(session=session, keys=wanted)
    if len(claimed) < len(wanted):
        raise too_late(len(wanted) - len(claimed))


def claim_those_in_time(*, session: Session, keys: Iterable[str]) -> set[str]:
    """Claim those of `keys` whose written-ahead rows are in time (due CLAIM_MARGIN later at
    least), in one statement (DELETE ... RETURNING), and return them: the rest are `late`. A
    caller that then refuses some request rolls its transaction back (or claims none of its
    keys here): a late request's objects keep their rows, for the sweeper."""
    wanted = set(keys)
    if not wanted:
        return set()
    due = clock.now(session) + CLAIM_MARGIN
    return set(session.execute(_CLAIM_IN_TIME, {"keys": list(wanted), "due": due}).scalars())


def claim(*, session: Session, keys: Sequence[str]) -> None:
    """Delete the written-ahead rows of these objects: in the transaction that commits the rows
    naming them, or once the objects were deleted again."""
    if keys:
        session.execute(
            delete(_garbage).where(
                _garbage.c.key.in_(set(keys)), _garbage.c.not_before.is_not(None)
            )
        )


def take_garbage(*, session: Session, limit: int, now: datetime | None = None) -> list[Garbage]:
    """The oldest `limit` objects or prefixes to delete from the store that are due `now`
    (the database's clock by default)."""
    due = now or clock.now(session)
    rows = session.execute(
        select(_garbage.c.id, _garbage.c.key, _garbage.c.prefix)
        .where(or_(_garbage.c.not_before.is_(None), _garbage.c.not_before <= due))
        .order_by(_garbage.c.id)
        .limit(limit)
    ).all()
    return [Garbage(row.id, row.key, bool(row.prefix)) for row in rows]


def forget_garbage(*, session: Session, ids: Sequence[int]) -> None:
    """Delete these garbage rows: the store has deleted what they named."""
    if ids:
        session.execute(delete(_garbage).where(_garbage.c.id.in_(ids)))


# ─── Size ─────────────────────────────────────────────────────────────────────────────────────────


def stored_size(*, session: Session) -> tuple[int, int]:
    """(owners, bytes) the database counts in the store: jobs that own objects and uploads, and
    the sum of their bytes (a presigned upload not yet checked counts no bytes). Two aggregates,
    no listing of the store: cheap enough for a scrape."""
    jobs = session.execute(
        select(func.count(_jobs.c.stored_bytes), func.coalesce(func.sum(_jobs.c.stored_bytes), 0))
    ).one()
    uploads = session.execute(
        select(func.count(_uploads.c.id), func.coalesce(func.sum(_uploads.c.size), 0))
    ).one()
    return int(jobs[0]) + int(uploads[0]), int(jobs[1]) + int(uploads[1])
