"""A job's claim: queued -> running, a compare-and-set that records a lease (owner, attempt,
expiry) and counts an attempt. `claim_next` fills a batch from the tenants that wait, in turn
(fair share, weighted), a tenant's own jobs by priority, then deadline (earliest first; a job
without one after those with one), then age; a job claimed before in this run runs alone
(Isolation). A job past its deadline, or never started and past its queue time-out, is
canceled instead of started.

Called by worker children (worker/batching.py). db/standing.py mirrors the order of
`claim_next` to tell a queued job its position: tests/db/test_standing.py holds the two together.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, Select, Update, bindparam, exists, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.types import Text

from db import clock, webhooks
from db.jobs._common import (
    _CLAIMED_BEFORE,
    _NEVER_CLAIMED,
    _NEVER_STARTED,
    _QUEUED,
    _inputs,
    _jobs,
    _tenants,
    _waiting,
)
from db.jobs.control import cancel_overdue, cancel_unstarted
from db.jobs.history import _appended, _history_line
from db.jobs.leases import Lease
from db.models import JobStatus


@functools.cache
def _claim_statement(*, fresh_only: bool, history: bool = True) -> Update:
    """The compare-and-set that claims jobs: only rows still queued (and, `fresh_only`, never
    claimed) move, so of two racing claimers exactly one wins each job (PostgreSQL re-checks
    the WHERE after a concurrent update; SQLite serializes writers). Built once: building a
    statement costs more than running it."""
    where = [
        _jobs.c.id.in_(bindparam("c_ids", expanding=True)),
        _QUEUED,
        _BEFORE_DEADLINE,
        _BEFORE_QUEUE_TIMEOUT,
    ]
    if fresh_only:
        where.append(_NEVER_CLAIMED)
    return (
        update(_jobs)
        .where(*where)
        .values(
            status=JobStatus.RUNNING.value,
            attempts=_jobs.c.attempts + 1,
            lease_owner=bindparam("c_owner"),
            lease_expires_at=bindparam("c_expires"),
            worker=bindparam("c_worker"),
            started_at=bindparam("c_now"),
            # `history=False`: the claim as it was before jobs kept one (bench/history.py).
            **({"history": _appended(bindparam("c_history", type_=Text))} if history else {}),
        )
        .returning(
            _jobs.c.id,
            _jobs.c.attempts,
            _jobs.c.samples,
            _jobs.c.priority,
            _jobs.c.created_at,
            _jobs.c.parent_id,
            _jobs.c.cache_key,
            _jobs.c.deadline_at,
            _jobs.c.queue_timeout_at,
            _jobs.c.webhook_events,
            _jobs.c.tenant,
            # Its inputs in the same statement: a SELECT after it would cost the claim a
            # statement's round of SQLAlchemy more than the read itself.
            select(_inputs.c.data)
            .where(_inputs.c.job_id == _jobs.c.id)
            .scalar_subquery()
            .label("inputs"),
        )
    )


# A claim never starts a job past its deadline, nor one past its queue time-out that never
# started (one taken back from a worker had): `_claim_ids` cancels it instead.
_BEFORE_DEADLINE = or_(_jobs.c.deadline_at.is_(None), _jobs.c.deadline_at > bindparam("c_now"))
_BEFORE_QUEUE_TIMEOUT = or_(
    _jobs.c.queue_timeout_at.is_(None),
    _jobs.c.queue_timeout_at > bindparam("c_now"),
    ~_NEVER_STARTED,
)


def _claim_ids(
    *,
    session: Session,
    job_ids: Sequence[str],
    owner: str,
    lease_s: float,
    worker: str,
    fresh_only: bool = False,
    canceled: list[str] | None = None,
) -> list[Lease]:
    """Claim the named jobs; those past their deadline or their queue time-out are canceled
    instead, and their ids appended to `canceled` (for the caller to announce once this
    transaction commits)."""
    if not job_ids:
        return []
    now = clock.now(session)
    rows = session.execute(
        _claim_statement(fresh_only=fresh_only),
        {
            "c_ids": list(job_ids),
            "c_owner": owner,
            "c_expires": now + timedelta(seconds=lease_s),
            "c_worker": worker,
            "c_now": now,
            "c_history": _history_line("started", now, worker),
        },
    ).all()
    if len(rows) < len(job_ids):  # taken by another claimer, ended, or late
        claimed = {row.id for row in rows}
        late = _cancel_late(session, now, [i for i in job_ids if i not in claimed])
        if canceled is not None:
            canceled.extend(late)
    started = [row.id for row in rows if webhooks.wants(row.webhook_events, webhooks.Event.START)]
    webhooks.record(session=session, event=webhooks.Event.START, job_ids=started, at=now)
    return [
        Lease(
            job_id=row.id,
            owner=owner,
            attempt=row.attempts,
            samples=row.samples,
            priority=row.priority,
            inputs=row.inputs or b"",
            created_at=row.created_at,
            started_at=now,
            parent_id=row.parent_id,
            cache_key=row.cache_key,
            deadline_at=row.deadline_at,
            queue_timeout_at=row.queue_timeout_at,
            webhook_events=row.webhook_events,
            tenant=row.tenant,
        )
        for row in rows
    ]


def _cancel_late(session: Session, now: datetime, among: list[str]) -> list[str]:
    """Cancel those of `among` (named to this claim, not claimed by it) still queued past their
    deadline or their queue time-out; their ids. One read when none is late, the usual case:
    another claimer took them, or they ended (the cancels lock and check again)."""
    past_deadline = _jobs.c.deadline_at <= now
    timed_out = _NEVER_STARTED & (_jobs.c.queue_timeout_at <= now)
    late = session.execute(
        select(_jobs.c.id, past_deadline.label("past_deadline")).where(
            _jobs.c.id.in_(among), _QUEUED, or_(past_deadline, timed_out)
        )
    ).all()
    if not late:
        return []
    overdue = [row.id for row in late if row.past_deadline]
    canceled = (
        cancel_overdue(session=session, now=now, among=overdue, queued=True) if overdue else []
    )
    rest = [row.id for row in late if row.id not in canceled]
    return canceled + (cancel_unstarted(session=session, now=now, among=rest) if rest else [])


def claim(
    *,
    session: Session,
    job_ids: Sequence[str],
    owner: str,
    lease_s: float,
    worker: str = "",
    canceled: list[str] | None = None,
) -> list[Lease]:
    """Claim the named jobs that are still queued; the others are skipped (taken or ended).
    Those past their deadline or queue time-out are canceled: their ids go to `canceled`, to be
    announced."""
    leases = _claim_ids(
        session=session,
        job_ids=job_ids,
        owner=owner,
        lease_s=lease_s,
        worker=worker or owner,
        canceled=canceled,
    )
    order = {job_id: i for i, job_id in enumerate(job_ids)}
    return sorted(leases, key=lambda lease: order[lease.job_id])


@functools.cache
def _waiting_tenants_statement(*, fresh_only: bool) -> Select[tuple[str, int]]:
    """The tenants with queued jobs of a model version, and their weights: an index probe each."""
    return (
        select(_tenants.c.name, _tenants.c.weight)
        .where(exists().where(_jobs.c.tenant == _tenants.c.name, *_waiting(fresh_only=fresh_only)))
        .order_by(_tenants.c.name)
    )


@functools.cache
def _candidates_statement(*, fresh_only: bool) -> Select[tuple[str, int]]:
    """One tenant's queued jobs of a model version, by priority, then deadline (`pick_deadline`:
    none sorts last), then age: `ix_jobs_pick`'s order, read without a sort."""
    return (
        select(_jobs.c.id, _jobs.c.samples)
        .where(_jobs.c.tenant == bindparam("n_tenant"), *_waiting(fresh_only=fresh_only))
        .order_by(_jobs.c.priority.desc(), _jobs.c.pick_deadline, _jobs.c.id)
        .limit(bindparam("n_limit"))
        .with_for_update(skip_locked=True)
    )


def claim_next(
    *,
    session: Session,
    model: str,
    version: int,
    owner: str,
    lease_s: float,
    max_samples: int,
    worker: str = "",
    take_oversized: bool = True,
    fresh_only: bool = False,
    canceled: list[str] | None = None,
) -> list[Lease]:
    """Claim queued jobs of one model version, up to `max_samples` samples: the tenants that
    wait take turns (fair share, weighted), and a tenant's own jobs go by priority, then
    deadline (earliest first, those without one last), then age.

    A job larger than `max_samples` is taken only alone (the worker runs it in chunks), and only
    with `take_oversized` (a caller that already holds jobs passes False: it has room for less).
    With `fresh_only`, only jobs never claimed in this run. A chosen job past its deadline or
    queue time-out is canceled instead of claimed; its id goes to `canceled` (for the caller
    to announce).
    """
    if max_samples <= 0:
        return []
    params = {"n_model": model, "n_version": version, "n_limit": max_samples}
    waiting = session.execute(_waiting_tenants_statement(fresh_only=fresh_only), params).all()
    queues = {
        row.name: _TenantQueue(
            weight=max(row.weight, 1),
            rows=deque(
                session.execute(
                    _candidates_statement(fresh_only=fresh_only), {**params, "n_tenant": row.name}
                ).all()
            ),
        )
        for row in waiting
    }
    chosen = _fair_fill(queues, room=max_samples, take_oversized=take_oversized)
    # Claimed as named, in the order the tenants' turns chose them.
    return claim(
        session=session,
        job_ids=chosen,
        owner=owner,
        lease_s=lease_s,
        worker=worker,
        canceled=canceled,
    )


@dataclass
class _TenantQueue:
    weight: int
    # (id, samples): its queued jobs, by priority, deadline, then age
    rows: deque[Row[tuple[str, int]]]
    served: int = 0  # samples taken into this batch

    @property
    def share(self) -> tuple[float, str]:
        """Who goes next: the least served for its weight; of equals, the one waiting longest."""
        return self.served / self.weight, self.rows[0].id


def _fair_fill(queues: dict[str, _TenantQueue], *, room: int, take_oversized: bool) -> list[str]:
    """Ids from the tenants' queues in turn (weighted: a tenant of weight 2 gets twice the
    samples of a tenant of weight 1 while both wait), until `room` samples are taken."""
    chosen: list[str] = []
    waiting = {tenant: queue for tenant, queue in queues.items() if queue.rows}
    while room > 0 and waiting:
        tenant = min(waiting, key=lambda t: waiting[t].share)
        queue = waiting[tenant]
        row = queue.rows.popleft()
        if not queue.rows:
            del waiting[tenant]
        if row.samples <= room:
            chosen.append(row.id)
            room -= row.samples
            queue.served += row.samples
        elif not chosen and take_oversized:
            return [row.id]  # alone: the worker runs it in chunks
    return chosen


# ─── Isolation ────────────────────────────────────────────────────────────────────────────────────
# A job claimed before in this run that did not end (its worker died, its batch ran past its time
# limit, its result could not be written) may be what went wrong: from then on it runs alone, so a
# job that crashes its worker costs no other job an attempt. `attempts > budget_from` on a queued
# job marks it; a client's `retry` starts a new run (`budget_from` = `attempts`), so a retried
# job batches with the others again. The choice holds when the rows move: the claim's
# compare-and-set re-checks `attempts = budget_from` (`fresh_only`), and `claim_retried` chooses
# with SELECT ... FOR UPDATE before `_claim_ids` moves the row (PostgreSQL; SQLite serializes
# writers).


def still_queued(*, session: Session, job_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """Of the named jobs, those still queued: never claimed, and claimed before (to run alone)."""
    if not job_ids:
        return [], []
    rows = session.execute(
        select(_jobs.c.id, _CLAIMED_BEFORE.label("claimed_before"))
        .where(_jobs.c.id.in_(list(job_ids)), _QUEUED)
        .order_by(_jobs.c.id)
    ).all()
    return [r.id for r in rows if not r.claimed_before], [r.id for r in rows if r.claimed_before]


def claim_next_fresh(**kwargs: Any) -> list[Lease]:
    """`claim_next` for jobs never claimed in this run (since their submit or a client's
    `retry`): what tops a batch up (a job lost once runs alone, see `claim_retried`)."""
    return claim_next(**kwargs, fresh_only=True)


def claim_retried(
    *,
    session: Session,
    job_ids: Sequence[str],
    owner: str,
    lease_s: float,
    worker: str = "",
    canceled: list[str] | None = None,
) -> Lease | None:
    """Claim one of the named queued jobs claimed before in this run (the oldest), to run alone;
    one past its deadline is canceled instead, its id put in `canceled` (to be announced). (A
    job claimed before started: its queue time-out no longer applies.)"""
    if not job_ids:
        return None
    job_id = session.scalars(
        select(_jobs.c.id)
        .where(_jobs.c.id.in_(job_ids), _QUEUED, _CLAIMED_BEFORE)
        .order_by(_jobs.c.id)
        .limit(1)
        .with_for_update()
    ).first()
    if job_id is None:
        return None
    leases = _claim_ids(
        session=session,
        job_ids=[job_id],
        owner=owner,
        lease_s=lease_s,
        worker=worker or owner,
        canceled=canceled,
    )
    return leases[0] if leases else None
