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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import Table, delete, exists, func, insert, or_, select, update
from sqlalchemy.orm import Session

from db import clock
from db.models import Job, JobInput, JobUpload, ObjectGarbage, Upload
from tffleet.objectstore import keys

_jobs: Table = Job.__table__  # type: ignore[assignment]
_inputs: Table = JobInput.__table__  # type: ignore[assignment]
_uploads: Table = Upload.__table__  # type: ignore[assignment]
_pins: Table = JobUpload.__table__  # type: ignore[assignment]
_garbage: Table = ObjectGarbage.__table__  # type: ignore[assignment]


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
) -> Upload:
    """Record an upload whose object is (or, presigned, will be) at `keys.upload_key`. `size`
    null: a presigned PUT not yet checked (`describe_upload` does, at its first reference)."""
    upload = Upload(
        id=upload_id,
        tenant=tenant,
        key=keys.upload_key(tenant, upload_id),
        size=size,
        dtype=dtype,
        shape=None if shape is None else list(shape),
        created_at=clock.now(session),
        expires_at=expires_at,
    )
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


def take_garbage(*, session: Session, limit: int) -> list[Garbage]:
    """The oldest `limit` objects or prefixes to delete from the store."""
    rows = session.execute(
        select(_garbage.c.id, _garbage.c.key, _garbage.c.prefix)
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
