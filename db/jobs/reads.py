"""Reads of jobs, changing nothing: one job (of a tenant), many by id, a tenant's pages, and the
counts and ids that admission, autoscaling, wake-ups and draining versions go by.

Called by the API (polls, pages, the queue limit, the models list) and by worker children (the
ids a wake-up names, whether a version still has work).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, bindparam, func, select
from sqlalchemy.orm import Session

from db.ids import cursor_id
from db.jobs._common import _QUEUED, _UNFINISHED, _jobs, _waiting
from db.models import Job, JobStatus
from tffleet.errors import InvalidRequest, JobNotFound


def count_queued(*, session: Session, tenant: str | None = None) -> int:
    """How many jobs (of `tenant`, unless None) wait for a worker: a count over an index.

    A tenant's count leaves out the parts of its split jobs (db/parts.py): it asked for the job,
    which counts once, as running. The fleet's count includes them: they are queued work."""
    query = select(func.count()).select_from(_jobs).where(_QUEUED)
    if tenant is not None:
        query = query.where(_jobs.c.tenant == tenant, _jobs.c.parent_id.is_(None))
    return int(session.scalar(query) or 0)


def count_unfinished(*, session: Session) -> dict[tuple[str, int], dict[str, int]]:
    """Queued and running jobs per model version: {(model, version): {status: count}}."""
    rows = session.execute(
        select(_jobs.c.model, _jobs.c.version, _jobs.c.status, func.count())
        .where(_UNFINISHED)
        .group_by(_jobs.c.model, _jobs.c.version, _jobs.c.status)
    ).all()
    counts: dict[tuple[str, int], dict[str, int]] = {}
    for model, version, status, count in rows:
        counts.setdefault((model, version), {})[status] = int(count)
    return counts


def has_unfinished(*, session: Session, model: str, version: int) -> bool:
    """Whether a job of this model version is still queued or running (a version drains)."""
    query = (
        select(_jobs.c.id)
        .where(_jobs.c.model == model, _jobs.c.version == version, _UNFINISHED)
        .limit(1)
    )
    return session.scalar(query) is not None


def queued_ids(
    *,
    session: Session,
    model: str,
    version: int,
    among: Sequence[str] | None = None,
    limit: int = 1000,
) -> list[str]:
    """Ids of queued jobs of one model version (only those `among` the given ids), oldest first."""
    query = select(_jobs.c.id).where(_jobs.c.model == model, _jobs.c.version == version, _QUEUED)
    if among is not None:
        query = query.where(_jobs.c.id.in_(list(among)))
    return list(session.scalars(query.order_by(_jobs.c.id).limit(limit)))


def some_queued(*, session: Session, model: str, version: int, limit: int) -> list[str]:
    """Up to `limit` ids of queued jobs of one model version never claimed in this run, in no
    particular order: a hint for a wake-up (the claim decides what runs), read from the index
    without sorting the queue. Jobs claimed before have wake-ups of their own."""
    query = (
        select(_jobs.c.id)
        .where(*_waiting(fresh_only=True))
        .params(n_model=model, n_version=version)
    )
    return list(session.scalars(query.limit(limit)))


def get(*, session: Session, job_id: str, tenant: str | None = None) -> Job:
    """A job by id; another tenant's job is not found (unless `tenant` is None: every tenant)."""
    # The state machine changes rows with Core UPDATEs, which do not touch objects this session
    # already holds: always read the row, never a stale object from the identity map.
    job = session.get(Job, job_id, populate_existing=True)
    if job is None or (tenant is not None and job.tenant != tenant):
        raise JobNotFound(f"job {job_id!r} not found")
    return job


_FETCH = select(_jobs).where(_jobs.c.id.in_(bindparam("ids", expanding=True)))


def fetch(*, session: Session, job_ids: Sequence[str]) -> dict[str, Row[Any]]:
    """Jobs by id (outputs included; inputs live in `job_inputs`), as plain rows: a poll's read."""
    if not job_ids:
        return {}
    return {row.id: row for row in session.execute(_FETCH, {"ids": list(job_ids)})}


def get_many(*, session: Session, job_ids: Sequence[str]) -> list[Job]:
    query = select(Job).where(Job.id.in_(job_ids)).execution_options(populate_existing=True)
    return list(session.scalars(query))


def list_jobs(
    *,
    session: Session,
    tenant: str | None = None,
    status: JobStatus | None = None,
    model: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    transform: str | None = None,
) -> tuple[list[Job], str | None]:
    """Newest first, of one tenant (None: every tenant's). `cursor` is the `next_cursor` of the
    previous page (the last id it held). `transform`: only the shards of that transform, which
    are left out otherwise (a transform of many shards would bury a tenant's own jobs)."""
    if limit < 1:
        raise InvalidRequest(f"limit: must be at least 1, got {limit}")
    # The parts of split jobs are the fleet's, not the client's (db/parts.py).
    query = select(Job).where(Job.parent_id.is_(None)).order_by(Job.id.desc()).limit(limit + 1)
    query = query.where(
        Job.transform_id.is_(None) if transform is None else Job.transform_id == transform
    )
    if tenant is not None:
        query = query.where(Job.tenant == tenant)
    if status is not None:
        query = query.where(Job.status == status.value)
    if model is not None:
        query = query.where(Job.model == model)
    if cursor is not None:
        query = query.where(Job.id < cursor_id(cursor))
    jobs = list(session.scalars(query))
    next_cursor = jobs[limit - 1].id if len(jobs) > limit else None
    return jobs[:limit], next_cursor
