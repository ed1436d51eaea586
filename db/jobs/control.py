"""A client's or a deadline's say over a job: `cancel` (any unfinished job; a running job's late
result is then fenced out), `cancel_overdue` (a job not ended by its `Cancel-After` deadline,
error `deadline`), `cancel_unstarted` (a queued job not started within its `Queue-Timeout`,
error `queue_timeout`), `retry` (a failed or canceled job runs again under its id, with a fresh
attempt budget) and `remove` (an ended job goes now, inputs, outputs and all).

Called by the API (its job routes), the sweeper (`cancel_overdue`, `cancel_unstarted`, through
db/jobs/sweep.py) and worker children (the claim cancels a job past its deadline or its queue
time-out instead of starting it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, delete, func, literal, select, update
from sqlalchemy.orm import Session
from sqlalchemy.types import Text

from db import cache, clock, objects, transforms, webhooks
from db.jobs._common import (
    _NEVER_STARTED,
    _QUEUED,
    _UNFINISHED,
    _deadline,
    _inputs,
    _jobs,
    _pick_deadline,
    _record_rows_ended,
)
from db.jobs.history import _appended, _history_line
from db.jobs.reads import get
from db.models import FINISHED, Job, JobErrorCode, JobStatus
from tffleet.errors import InputsGone, JobAlreadyFinished, JobNotEnded, JobNotRetryable

_ENDED_ON_ITS_OWN = frozenset({JobStatus.SUCCEEDED.value, JobStatus.FAILED.value})

# What a job that ended without success may do: run again (`retry`).
_RETRYABLE = (JobStatus.FAILED.value, JobStatus.CANCELED.value)


# ─── Cancel ───────────────────────────────────────────────────────────────────────────────────────


def cancel(*, session: Session, job_id: str, tenant: str | None = None) -> Job:
    """Cancel a queued or running job (of `tenant`, unless None). A running job's late result is
    then fenced out."""
    job = get(session=session, job_id=job_id, tenant=tenant)
    now = clock.now(session)
    result = session.execute(
        update(_jobs)
        .where(
            _jobs.c.id == job_id,
            _jobs.c.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value]),
        )
        .values(
            status=JobStatus.CANCELED.value,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    if result.rowcount:  # type: ignore[attr-defined]
        # A split job's parts go with it (db/parts.py); a late result of one finds no row.
        session.execute(delete(_jobs).where(_jobs.c.parent_id == job_id))
        transforms.shard_failed(session, [job_id])  # a transform's shard: it will not finish
        if webhooks.wants(job.webhook_events, webhooks.Event.COMPLETED):
            webhooks.record(
                session=session, event=webhooks.Event.COMPLETED, job_ids=[job_id], at=now
            )
    session.refresh(job)
    # Canceling twice is not an error; canceling a job that ran to its end is.
    if result.rowcount == 0 and job.status in _ENDED_ON_ITS_OWN:  # type: ignore[attr-defined]
        raise JobAlreadyFinished(f"job {job_id!r} already finished as {job.status}")
    return job


def cancel_overdue(
    *,
    session: Session,
    now: datetime | None = None,
    among: Sequence[str] | None = None,
    queued: bool = False,
    limit: int = 1000,
) -> list[str]:
    """Cancel unfinished jobs past their deadline (`Cancel-After`), error `deadline`; returns
    their ids. At most `limit`, only those `among` the given ids (if given), only queued ones
    with `queued` (the claim's call: it never starts one). As `cancel` does: a running job's
    lease is cleared, so its late result matches no fence, and a split job's parts go."""
    now = now or clock.now(session)
    overdue = [_QUEUED if queued else _UNFINISHED, _jobs.c.deadline_at <= now]
    if among is not None:
        overdue.append(_jobs.c.id.in_(list(among)))
    ids = _locked_ids(session, overdue, limit)
    if not ids:
        return []
    running = _jobs.c.status == JobStatus.RUNNING.value
    canceled = session.execute(
        update(_jobs)
        .where(_jobs.c.id.in_(ids), *overdue)
        .values(
            status=JobStatus.CANCELED.value,
            error_code=JobErrorCode.DEADLINE.value,
            error_message=case(
                (running, "canceled while running: not ended by its deadline (Cancel-After)"),
                else_="canceled before it ran: not started by its deadline (Cancel-After)",
            ),
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        )
        .returning(_jobs.c.id, _jobs.c.webhook_events)
    ).all()
    if canceled:
        session.execute(delete(_jobs).where(_jobs.c.parent_id.in_([row.id for row in canceled])))
        _record_rows_ended(session, canceled, now)
        transforms.shard_failed(session, [row.id for row in canceled])
    return sorted(row.id for row in canceled)


def cancel_unstarted(
    *,
    session: Session,
    now: datetime | None = None,
    among: Sequence[str] | None = None,
    limit: int = 1000,
) -> list[str]:
    """Cancel queued jobs that no worker started by their `Queue-Timeout`, error
    `queue_timeout`; returns their ids. At most `limit`, only those `among` the given ids (if
    given: the claim's call). A job taken back from a worker started, and is left alone. They
    never ran: no lease to clear, no parts, no device time (`device_s` 0 where it had none)."""
    now = now or clock.now(session)
    late = [_QUEUED, _NEVER_STARTED, _jobs.c.queue_timeout_at <= now]
    if among is not None:
        late.append(_jobs.c.id.in_(list(among)))
    ids = _locked_ids(session, late, limit)
    if not ids:
        return []
    canceled = session.execute(
        update(_jobs)
        .where(_jobs.c.id.in_(ids), *late)
        .values(
            status=JobStatus.CANCELED.value,
            error_code=JobErrorCode.QUEUE_TIMEOUT.value,
            error_message="canceled before it ran: no worker started it within its Queue-Timeout",
            finished_at=now,
            device_s=func.coalesce(_jobs.c.device_s, 0.0),
        )
        .returning(_jobs.c.id, _jobs.c.webhook_events)
    ).all()
    if canceled:
        _record_rows_ended(session, canceled, now)
    return sorted(row.id for row in canceled)


# ─── Retry and delete ─────────────────────────────────────────────────────────────────────────────


def retry(
    *,
    session: Session,
    job_id: str,
    tenant: str | None = None,
    cancel_after_s: float | None = None,
    input_ttl_s: float | None = None,
    queue_timeout_s: float | None = None,
) -> Job:
    """Queue a failed or canceled job (of `tenant`, unless None) again under its id: its error,
    outputs, lease and split parts cleared, a fresh attempt budget, a new deadline and queue
    time-out (or none).
    Its inputs must still be stored: the sweeper deletes them `input_ttl_s` (TFFLEET_INPUT_TTL_S,
    named in the error) after it ends.

    `attempts` goes on counting (the job's history, and the fence: a late result of an earlier
    run carries an older attempt number and matches nothing). The caller publishes its wake-up.
    """
    job = get(session=session, job_id=job_id, tenant=tenant)
    if job.parent_id is not None:
        raise JobNotRetryable(f"job {job_id!r} is a part of job {job.parent_id!r}; retry that")
    if job.status not in _RETRYABLE:
        raise JobNotRetryable(_not_retryable(job_id, job.status))
    if session.scalar(select(_inputs.c.job_id).where(_inputs.c.job_id == job_id)) is None:
        kept = "" if input_ttl_s is None else f" ({input_ttl_s:g} s)"
        raise InputsGone(
            f"job {job_id!r}: its inputs are no longer stored, so it cannot run again (its "
            f"inputs are kept for TFFLEET_INPUT_TTL_S{kept} after it ends); submit it anew"
        )
    now = clock.now(session)
    result = session.execute(
        update(_jobs)
        .where(_jobs.c.id == job_id, _jobs.c.status.in_(_RETRYABLE))
        .values(
            status=JobStatus.QUEUED.value,
            error_code=None,
            error_message=None,
            outputs=None,
            lease_owner=None,
            lease_expires_at=None,
            worker=None,
            started_at=None,
            finished_at=None,
            expires_at=None,  # stamped again once it ends (`stamp_expiry`)
            published_at=now,  # the caller's wake-up: not stale before TFFLEET_REPUBLISH_AFTER_S
            budget_from=_jobs.c.attempts,
            parts=None,
            samples_done=None,
            deadline_at=_deadline(now, cancel_after_s),
            pick_deadline=_pick_deadline(_deadline(now, cancel_after_s)),
            queue_timeout_at=_deadline(now, queue_timeout_s),
            # How the last run ended goes into the history: the columns that said so are cleared.
            history=_appended(
                literal(
                    _history_line(job.status, job.finished_at or now, job.error_code or "")
                    + _history_line("retried", now),
                    Text,
                )
            ),
        )
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        job = get(session=session, job_id=job_id, tenant=tenant)  # retried by another request
        raise JobNotRetryable(_not_retryable(job_id, job.status))
    transforms.shard_retried(session, [job_id])  # a transform's shard: no longer failed
    # A split job runs whole again: the parts of its last run go (their inputs with them, and
    # the objects they own in the store after them).
    parts = list(session.scalars(select(_jobs.c.id).where(_jobs.c.parent_id == job_id)))
    objects.doom_jobs(session=session, job_ids=parts)
    session.execute(delete(_jobs).where(_jobs.c.parent_id == job_id))
    return get(session=session, job_id=job_id, tenant=tenant)


def _not_retryable(job_id: str, status: str) -> str:
    return f"job {job_id!r} is {status}: only a failed or canceled job can be retried"


def remove(*, session: Session, job_id: str, tenant: str | None = None) -> None:
    """Delete an ended job (of `tenant`, unless None) now: its row, inputs, outputs, parts, and
    its outputs in the response cache. A queued or running job must be canceled first, so a
    job is never deleted under a worker that runs it, nor one whose client awaits it."""
    job = get(session=session, job_id=job_id, tenant=tenant)
    ended = [status.value for status in FINISHED]
    # Its parts (and every row's inputs) go with it: ON DELETE CASCADE; its objects in the store
    # after it (named here, in its transaction: a refusal below rolls them back with it).
    objects.doom_jobs(session=session, job_ids=[job_id])
    result = session.execute(delete(_jobs).where(_jobs.c.id == job_id, _jobs.c.status.in_(ended)))
    if not result.rowcount:  # type: ignore[attr-defined]
        job = get(session=session, job_id=job_id, tenant=tenant)
        raise JobNotEnded(
            f"job {job_id!r} is {job.status}: cancel it first (POST /v1/jobs/{job_id}/cancel), "
            "then delete it"
        )
    if job.cache_key:
        cache.forget(session=session, keys=[job.cache_key])


def _locked_ids(session: Session, where: Sequence[Any], limit: int) -> list[str]:
    """The ids of at most `limit` jobs matching `where`, locked in id order (the order every
    writer of many jobs locks in), skipping rows a worker is writing now, as `_take_back` does."""
    statement = (
        select(_jobs.c.id)
        .where(*where)
        .order_by(_jobs.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(session.scalars(statement))
