"""What the modules of a job's life share: the tables, the predicates on a job's state that
several of them put in their SQL, and the webhook record of jobs that an UPDATE ended.

Private to db/jobs/: imported by its modules (whichever process calls them), never from outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, Table, bindparam
from sqlalchemy.orm import Session

from db import webhooks
from db.models import Job, JobInput, JobStatus, Tenant
from db.models.jobs import NO_DEADLINE

_jobs: Table = Job.__table__  # type: ignore[assignment]
_inputs: Table = JobInput.__table__  # type: ignore[assignment]
_tenants: Table = Tenant.__table__  # type: ignore[assignment]

_QUEUED = _jobs.c.status == JobStatus.QUEUED.value
# Never claimed in this run: since its submit, or since a client's `retry` (which starts a run
# afresh: `budget_from` = its attempts then). A job taken back in this run runs alone (Isolation).
# `<=` means `=` (attempts never falls below budget_from), written so for PostgreSQL's planner: it
# guesses a column equal to another column at 0.5% of rows, and then sorts the whole queue
# instead of walking ix_jobs_pick (tests/db/test_claim_plan.py); `<=` it guesses at a third.
_NEVER_CLAIMED = _jobs.c.attempts <= _jobs.c.budget_from
_CLAIMED_BEFORE = _jobs.c.attempts > _jobs.c.budget_from


_UNFINISHED = _jobs.c.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])


def _waiting(*, fresh_only: bool) -> list[ColumnElement[bool]]:
    """Queued jobs of the model version bound as `n_model`, `n_version`."""
    where = [
        _jobs.c.model == bindparam("n_model"),
        _jobs.c.version == bindparam("n_version"),
        _QUEUED,
    ]
    return [*where, _NEVER_CLAIMED] if fresh_only else where


def _deadline(now: datetime, cancel_after_s: float | None) -> datetime | None:
    """When a job given `Cancel-After` (or `Queue-Timeout`) now runs out; None without one."""
    return None if cancel_after_s is None else now + timedelta(seconds=cancel_after_s)


def _pick_deadline(deadline_at: datetime | None) -> datetime:
    """A job's `pick_deadline`: where the claim puts it among its tenant's jobs of its priority."""
    return NO_DEADLINE if deadline_at is None else deadline_at


# Queued and never started (since its submit or a client's `retry`; `unclaim` undoes a start that
# never ran): what a `Queue-Timeout` applies to. A job taken back from a worker started.
_NEVER_STARTED = _jobs.c.started_at.is_(None)


def _record_rows_ended(session: Session, rows: Sequence[Row[Any]], now: datetime) -> None:
    """The `completed` webhook of jobs an UPDATE ... RETURNING (id, webhook_events) ended."""
    ended = [row.id for row in rows if webhooks.wants(row.webhook_events, webhooks.Event.COMPLETED)]
    webhooks.record(session=session, event=webhooks.Event.COMPLETED, job_ids=ended, at=now)


JobGroups = dict[tuple[str, int], list[str]]
"""Job ids by (model, version): what one wake-up message can name."""
