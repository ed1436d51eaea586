"""The sweeper's side of a job's life beyond its lease: jobs past their deadline or queue
time-out (`cancel_late`), wake-ups that were lost (`stale_queued`, `mark_published`), ended jobs
past their retention (`stamp_expiry`, `purge_finished`) and the inputs of ended jobs past
theirs, which is shorter (`oldest_kept_inputs`, `purge_inputs`). Leases whose worker vanished
are taken back in db/jobs/leases.py.

Called by the sweeper (worker/sweeper.py), one active at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import bindparam, delete, exists, func, select, update
from sqlalchemy.orm import Session

from db import clock, objects
from db.jobs._common import JobGroups, _inputs, _jobs
from db.jobs.control import cancel_overdue, cancel_unstarted
from db.models import FINISHED, JobErrorCode, JobStatus, ModelPresence, PresenceState


class Late(NamedTuple):
    """What one chunk of `cancel_late` canceled, by why: their ids."""

    deadline: list[str]  # queued or running, past their deadline (`Cancel-After`)
    queue_timeout: list[str]  # queued, not started within their `Queue-Timeout`

    def kinds(self) -> list[tuple[JobErrorCode, str, list[str]]]:
        """(error code, why as a log says it, ids) of each kind."""
        return [
            (JobErrorCode.DEADLINE, "past their deadline", self.deadline),
            (
                JobErrorCode.QUEUE_TIMEOUT,
                "not started within their queue time-out",
                self.queue_timeout,
            ),
        ]

    def full(self, limit: int) -> bool:
        """Whether either kind reached the chunk's limit: there may be more."""
        return max(len(self.deadline), len(self.queue_timeout)) >= limit


def cancel_late(*, session: Session, now: datetime, limit: int) -> Late:
    """Cancel, in one chunk of at most `limit` jobs of each kind, unfinished jobs past their
    deadline (error `deadline`), then queued jobs that no worker started by their queue
    time-out (error `queue_timeout`): those that the claim, which never starts either, did not
    meet first (no worker claims their version, or none had room)."""
    deadline = cancel_overdue(session=session, now=now, limit=limit)
    return Late(deadline, cancel_unstarted(session=session, now=now, limit=limit))


def stale_queued(
    *, session: Session, older_than: datetime, limit: int, held_since: datetime | None = None
) -> JobGroups:
    """Queued jobs whose last wake-up (the submit's, or the sweeper's) was before `older_than`.

    Oldest jobs first, at most `limit`. Such a job may still have a message waiting in Redis
    behind a backlog; publishing it again is harmless (a claim takes a job once). With
    `held_since`, only jobs of versions that a child seen since then holds: a wake-up for a
    version no live worker runs would only pile up in its queue.
    """
    last_wakeup = func.coalesce(_jobs.c.published_at, _jobs.c.created_at)
    query = select(_jobs.c.id, _jobs.c.model, _jobs.c.version).where(
        _jobs.c.status == JobStatus.QUEUED.value, last_wakeup < older_than
    )
    if held_since is not None:
        query = query.where(
            exists().where(
                ModelPresence.name == _jobs.c.model,
                ModelPresence.version == _jobs.c.version,
                ModelPresence.seen_at >= held_since,
                ModelPresence.state.in_([PresenceState.LOADED.value, PresenceState.DRAINING.value]),
            )
        )
    rows = session.execute(query.order_by(_jobs.c.id).limit(limit)).all()
    groups: JobGroups = {}
    for row in rows:
        groups.setdefault((row.model, row.version), []).append(row.id)
    return groups


def mark_published(*, session: Session, job_ids: Sequence[str], at: datetime) -> int:
    """Record that a wake-up naming these jobs was published at `at` (those still queued)."""
    if not job_ids:
        return 0
    result = session.execute(
        update(_jobs)
        .where(_jobs.c.id.in_(job_ids), _jobs.c.status == JobStatus.QUEUED.value)
        .values(published_at=at)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


# ─── Purge ────────────────────────────────────────────────────────────────────────────────────────


def stamp_expiry(*, session: Session, limit: int) -> int:
    """Give ended jobs that have a `ttl_s` of their own their `expires_at`; returns how many.

    SQL has no portable "timestamp plus a column of seconds", so the sweeper works it out here,
    a bounded chunk per call.
    """
    rows = session.execute(
        select(_jobs.c.id, _jobs.c.finished_at, _jobs.c.ttl_s)
        .where(
            _jobs.c.status.in_([status.value for status in FINISHED]),
            _jobs.c.ttl_s.is_not(None),
            _jobs.c.expires_at.is_(None),
            _jobs.c.finished_at.is_not(None),
        )
        .limit(limit)
    ).all()
    if not rows:
        return 0
    session.execute(
        update(_jobs)
        .where(_jobs.c.id == bindparam("b_id"))
        .values(expires_at=bindparam("b_expires_at")),
        [
            {"b_id": row.id, "b_expires_at": row.finished_at + timedelta(seconds=row.ttl_s)}
            for row in rows
        ],
    )
    return len(rows)


_ENDED = [status.value for status in FINISHED]


def purge_finished(
    *, session: Session, older_than: datetime, limit: int, now: datetime | None = None
) -> int:
    """Delete at most `limit` ended jobs past their retention; returns how many.

    That is: jobs without a `ttl_s` that finished before `older_than`, and jobs with one whose
    `expires_at` (see `stamp_expiry`) is before `now`. One bounded chunk per call, so the caller
    can commit between chunks and no transaction holds a large part of the table.

    Each is read by the index of its time, the status checked on what it finds: given
    `status IN (...)`, SQLite's planner read every ended job by the status index instead, each
    sweep, under the sweep's write lock (a job that has a `finished_at` or an `expires_at` has
    ended: a retry clears both; the DELETE checks again).
    """
    now = now or clock.now(session)
    ended = _jobs.c.status.in_(_ENDED)
    by_default = select(_jobs.c.id, _jobs.c.status).where(
        _jobs.c.finished_at < older_than, _jobs.c.ttl_s.is_(None)
    )
    by_own = select(_jobs.c.id, _jobs.c.status).where(_jobs.c.expires_at < now)
    rows = list(session.execute(by_default.order_by(_jobs.c.finished_at).limit(limit)).all())
    rows += session.execute(by_own.order_by(_jobs.c.expires_at).limit(limit - len(rows))).all()
    ids = [row.id for row in rows if row.status in _ENDED]
    if not ids:
        return 0
    # Their objects in the store go after them (the sweeper's garbage step).
    objects.doom_jobs(session=session, job_ids=ids)
    result = session.execute(delete(_jobs).where(_jobs.c.id.in_(ids), ended))
    return int(result.rowcount)  # type: ignore[attr-defined]


# ─── Inputs ───────────────────────────────────────────────────────────────────────────────────────
# Only a retry reads an ended job's inputs, and they are most of the database's bytes: they go
# after TFFLEET_INPUT_TTL_S, long before the job and its outputs. Queued and running jobs keep
# theirs, a split job too while its parts run (it is `running`); an ended part's go, as no part
# runs again once ended (its job's retry runs whole, from the job's own inputs).


def oldest_kept_inputs(*, session: Session) -> datetime | None:
    """When the earliest-ended job that still keeps its inputs ended (None: no ended job does).

    Read from `job_inputs` (what is kept: the backlog and the last TFFLEET_INPUT_TTL_S), not
    from the jobs, whose ended rows of the whole result retention have mostly none left: where
    the sweeper starts `purge_inputs` after it starts."""
    return session.scalar(
        select(func.min(_jobs.c.finished_at))
        .select_from(_inputs.join(_jobs, _jobs.c.id == _inputs.c.job_id))
        .where(_jobs.c.status.in_(_ENDED))
    )


class InputsPurged(NamedTuple):
    deleted: int  # jobs whose inputs were deleted
    reached: datetime | None  # when the last of them ended: where the next chunk starts


def purge_inputs(
    *, session: Session, since: datetime, older_than: datetime, limit: int
) -> InputsPurged:
    """Delete the inputs of at most `limit` ended jobs that ended in [`since`, `older_than`),
    earliest first. The jobs stay, outputs and all, until their own retention (`purge_finished`).

    The range walks the finished_at index from `since`, where the last chunk stopped, instead of
    from the first job kept, whose inputs went long ago: a sweep reads what ended since the last.
    The status is checked here, not in SQL: given `status IN (...)`, SQLite's planner read every
    ended job by the status index instead, under the sweep's write lock (a job that has a
    `finished_at` has ended; a retry clears it, so this is a second guard)."""
    found = (
        select(_jobs.c.id, _jobs.c.finished_at, _jobs.c.status)
        .where(
            _jobs.c.finished_at >= since,
            _jobs.c.finished_at < older_than,
            exists().where(_inputs.c.job_id == _jobs.c.id),
        )
        .order_by(_jobs.c.finished_at)
        .limit(limit)
    )
    rows = session.execute(found).all()
    if not rows:
        return InputsPurged(0, None)
    ids = [row.id for row in rows if row.status in _ENDED]
    # Large inputs lie in the store, under the job's inputs/ (a job with stored_bytes has some).
    objects.doom_inputs(session=session, job_ids=ids)
    session.execute(delete(_inputs).where(_inputs.c.job_id.in_(ids)))
    return InputsPurged(len(rows), rows[-1].finished_at)
