"""Every change of a job's state, in one place, in the order of a job's life.

                     ┌──── release, expire_leases, take_back_from ────┐
                     ▼                                                 │
    create ──▶ queued ───claim───▶ running ───complete───▶ succeeded   │
                 │                   │ ├────────fail─────▶ failed      │
                 │                   │ ├──expire_leases──▶ failed      │
                 │                   │ │  take_back_from               │
                 │                   │ └───────────────────────────────┘
                 └──────cancel───────┴────────cancel─────▶ canceled
                 └──claim, cancel_overdue (deadline)──┴───────▶ canceled

    failed, canceled ──retry──▶ queued
    succeeded, failed, canceled ──purge_finished (past their retention), delete──▶ deleted

- create: `queued` rows, committed before any wake-up is published (Create).
- claim: a compare-and-set, queued -> running, that records a lease (owner, attempt, expiry)
  and counts an attempt. A job claimed before runs alone (Claim, Isolation).
- heartbeat: extends a lease while its batch runs (Heartbeat).
- complete, fail, release: write only where the lease still matches (owner and attempt), so a
  stale or duplicate worker cannot overwrite a result; `fail` ends it with a `JobErrorCode`,
  `release` hands it back to the queue after a fault that is not the job's (End).
- cancel: any unfinished job; a running job's late result is then fenced out (Cancel). A job
  with a deadline (`Cancel-After`) that has not ended by then is canceled the same way, with
  error `deadline`: by the claim that would start it, or by the sweeper (`cancel_overdue`).
- retry: a failed or canceled job runs again under its id, with a fresh attempt budget; delete:
  an ended job goes now, inputs, outputs and all (Retry and delete).
- expire_leases: the sweeper takes back jobs whose lease ran out: `queued` again, or `failed`
  (`worker_lost`) once they used their attempt budget; take_back_from does the same at once for
  a child its worker saw die; stale_queued and mark_published find and record lost wake-ups
  (Sweep).
- stamp_expiry, purge_finished: ended jobs past their retention are deleted (Purge).
- Reads for the API and the workers come last (Reads).

worker/retry.py maps which of these paths make a job run again.
"""

from __future__ import annotations

import functools
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    RowMapping,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlalchemy.types import Text

from db import cache, clock, webhooks
from db.ids import new_job_id
from db.models import (
    DEFAULT_TENANT,
    FINISHED,
    Job,
    JobErrorCode,
    JobInput,
    JobStatus,
    ModelPresence,
    PresenceState,
    Tenant,
)
from tffleet.errors import (
    IdempotencyKeyReused,
    InputsGone,
    InvalidRequest,
    JobAlreadyFinished,
    JobNotEnded,
    JobNotFound,
    JobNotRetryable,
    ServiceUnavailable,
    TffleetError,
)

_jobs: Table = Job.__table__  # type: ignore[assignment]
_inputs: Table = JobInput.__table__  # type: ignore[assignment]
_tenants: Table = Tenant.__table__  # type: ignore[assignment]


# ─── Shapes ───────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class NewJob:
    model: str
    version: int
    samples: int
    inputs: bytes
    priority: int = 0
    # Set together, for `create_idempotent`: the job's own key (unique in the table) and the
    # sha256 of the request it came in, which a replay of that key must match.
    idempotency_key: str | None = None
    request_hash: str | None = None
    ttl_s: int | None = None  # its own retention after it ends; None: the sweeper's default
    tenant: str = DEFAULT_TENANT
    # Its key in the response cache, for a model with `cache = true` (db/cache.py).
    cache_key: str | None = None
    # `Cancel-After`: not ended this many seconds after it is stored, it is canceled.
    cancel_after_s: float | None = None
    # Its webhook and the events it asked for (bits of `db.webhooks.Event`); see db/webhooks.py.
    webhook: str | None = None
    webhook_events: int | None = None


@dataclass(frozen=True)
class Submitted:
    """A keyed request's jobs, in its order, as stored now: by this call, or by an earlier one."""

    jobs: list[Row[Any]]  # every column but inputs and outputs
    created: list[str]  # the ids this call stored, to be published; empty for a replay

    @property
    def replayed(self) -> bool:
        return not self.created


@dataclass(frozen=True)
class Lease:
    """A claimed job: the fencing token (owner, attempt) and what the worker needs to run it."""

    job_id: str
    owner: str
    attempt: int
    samples: int
    priority: int
    inputs: bytes
    created_at: datetime | None = None  # for the queue-wait metric
    started_at: datetime | None = None  # as stored by the claim
    parent_id: str | None = None  # the split job this is a part of (db/parts.py)
    cache_key: str | None = None  # its outputs go to the response cache (db/cache.py)
    deadline_at: datetime | None = None  # as stored (`Cancel-After`), for its announcement
    webhook_events: int | None = None  # its webhook's events: its end is recorded for them


_QUEUED = _jobs.c.status == JobStatus.QUEUED.value
# Never claimed in this run: since its submit, or since a client's `retry` (which starts a run
# afresh: `budget_from` = its attempts then). A job taken back in this run runs alone (Isolation).
# `<=` means `=` (attempts never falls below budget_from), written so for PostgreSQL's planner: it
# guesses a column equal to another column at 0.5% of rows, and then sorts the whole queue
# instead of walking ix_jobs_pick (tests/db/test_claim_plan.py); `<=` it guesses at a third.
_NEVER_CLAIMED = _jobs.c.attempts <= _jobs.c.budget_from
_CLAIMED_BEFORE = _jobs.c.attempts > _jobs.c.budget_from


_UNFINISHED = _jobs.c.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])


_ENDED_ON_ITS_OWN = frozenset({JobStatus.SUCCEEDED.value, JobStatus.FAILED.value})

# What a job that ended without success may do: run again (`retry`).
_RETRYABLE = (JobStatus.FAILED.value, JobStatus.CANCELED.value)


# ─── History ──────────────────────────────────────────────────────────────────────────────────────
# What a job's columns do not keep (each attempt's start and its worker, each return to the queue
# and why, each retry), one line each in `history`, appended by the UPDATE that makes the change:
# `event<TAB>ISO time<TAB>detail<LF>`. Creation and the end are its columns' (created_at,
# finished_at and status).


@dataclass(frozen=True)
class HistoryEvent:
    event: str  # "started", "requeued", "put back"; "failed" or "canceled", then "retried"
    at: datetime
    detail: str


def _history_line(event: str, at: datetime, detail: str = "") -> str:
    return f"{event}\t{at.isoformat()}\t{' '.join(detail.split())}\n"


def _appended(line: ColumnElement[str]) -> ColumnElement[str]:
    """`history` with `line` appended (in SQL: `coalesce(history, '') || line`)."""
    return func.coalesce(_jobs.c.history, literal("", Text)) + line


def _logged(event: str, at: datetime, detail: str = "") -> ColumnElement[str]:
    return _appended(literal(_history_line(event, at, detail), Text))


def history_of(job: Job) -> list[HistoryEvent]:
    """A job's history, oldest first (loads the deferred column: call it inside a session)."""
    events = []
    for line in (job.history or "").splitlines():
        event, at, detail = [*line.split("\t", 2), "", ""][:3]
        try:
            events.append(HistoryEvent(event, datetime.fromisoformat(at), detail))
        except ValueError:
            continue  # not a line this code wrote
    return events


# ─── Create ───────────────────────────────────────────────────────────────────────────────────────


def create(*, session: Session, jobs: Sequence[NewJob]) -> list[Job]:
    """Insert queued jobs in one statement; returns them as detached objects (not in the session).
    A job the response cache answers is stored `succeeded` at once (db/cache.py).

    A Core insert: the ORM's unit of work would cost more than the insert itself on this path.
    """
    now = clock.now(session)
    rows = [_row(job, now) for job in jobs]
    answered = cache.answer(session=session, rows=rows, now=now)
    if rows:
        session.execute(insert(_jobs), _uniform(rows))
        inputs = [
            {"job_id": row["id"], "data": job.inputs}
            for row, job in zip(rows, jobs, strict=True)
            if row["id"] not in answered
        ]
        if inputs:
            session.execute(insert(_inputs), inputs)
        _record_answered(session, rows, answered, now)
    created = [Job(**row) for row in rows]
    for job, new in zip(created, jobs, strict=True):
        job.inputs = new.inputs  # type: ignore[attr-defined]
    return created


_SUBMITTED_COLUMNS = [c for c in _jobs.c if c.name != "outputs"]
# Keys per SELECT: well under every backend's limit on bound parameters.
_KEYS_PER_SELECT = 1000


def create_idempotent(
    *, session: Session, requests: Sequence[Sequence[NewJob]]
) -> list[Submitted | TffleetError]:
    """Store keyed requests; per request, its jobs (new, or stored before) or the error to answer.

    Every job carries its own `idempotency_key` and its request's `request_hash`; keys are per
    tenant (two tenants' equal keys never meet). A key that is already stored under the same
    hash gives back the stored job (a replay: nothing is added); under another hash, the request
    is `IdempotencyKeyReused` and none of its jobs stays.

    INSERT ... ON CONFLICT DO NOTHING, so a taken key never raises: one request's conflict
    cannot fail the others that share the transaction. Of two transactions racing on a key, the
    second waits for the first to commit (PostgreSQL) or runs after it (SQLite), inserts nothing
    and then reads the first one's row.
    """
    now = clock.now(session)
    per_request: list[list[tuple[dict[str, Any], bytes]]] = []
    for request in requests:
        if not request or any(j.idempotency_key is None or j.request_hash is None for j in request):
            raise ValueError("create_idempotent: every job needs an idempotency_key and a hash")
        per_request.append([(_row(job, now), job.inputs) for job in request])
    # Rows in key order: transactions inserting overlapping keys take them in the same order
    # and cannot deadlock. Request order within a key: the first request of a batch wins it.
    by_key = sorted(
        ((index, row, data) for index, rows in enumerate(per_request) for row, data in rows),
        key=lambda item: (_tenant_key(item[1]), item[0]),
    )
    if not by_key:
        return []
    answered = cache.answer(session=session, rows=[row for _, row, _ in by_key], now=now)
    inserted = set(
        session.scalars(
            _insert_unless_key_taken(session).returning(_jobs.c.id),
            _uniform([row for _, row, _ in by_key]),
        )
    )
    inputs = [
        {"job_id": row["id"], "data": data}
        for _, row, data in by_key
        if row["id"] in inserted and row["id"] not in answered
    ]
    if inputs:
        session.execute(insert(_inputs), inputs)
    _record_answered(session, [row for _, row, _ in by_key], answered & inserted, now)
    keys_by_tenant: dict[str, list[str]] = {}
    for _, row, _ in by_key:
        keys_by_tenant.setdefault(row["tenant"], []).append(row["idempotency_key"])
    stored: dict[tuple[str, str], Row[Any]] = {}
    for tenant, keys in keys_by_tenant.items():
        for start in range(0, len(keys), _KEYS_PER_SELECT):
            query = select(*_SUBMITTED_COLUMNS).where(
                _jobs.c.tenant == tenant,
                _jobs.c.idempotency_key.in_(keys[start : start + _KEYS_PER_SELECT]),
            )
            stored.update((_tenant_key(row._mapping), row) for row in session.execute(query))

    results: list[Submitted | TffleetError] = []
    for mine in per_request:
        found = [stored.get(_tenant_key(row)) for row, _ in mine]
        ours = [row["id"] for row, _ in mine if row["id"] in inserted]
        first, request_hash = mine[0][0]["idempotency_key"], mine[0][0]["request_hash"]
        error: TffleetError | None = None
        if any(row is None for row in found):  # deleted between our INSERT and SELECT
            error = ServiceUnavailable(
                f"Idempotency-Key {first!r}: its job was deleted while this request ran; try again"
            )
        elif any(row.request_hash != request_hash for row in found if row is not None):
            error = IdempotencyKeyReused(
                f"Idempotency-Key {first!r} was already used for a different request (model, "
                "version, priority or inputs differ); send a new key for a new request"
            )
        if error is not None:
            if ours:  # not committed yet: as if never stored
                session.execute(delete(_inputs).where(_inputs.c.job_id.in_(ours)))
                session.execute(delete(_jobs).where(_jobs.c.id.in_(ours)))
            results.append(error)
        else:
            results.append(Submitted(jobs=[row for row in found if row is not None], created=ours))
    return results


def _record_answered(
    session: Session, rows: Sequence[dict[str, Any]], answered: set[str], now: datetime
) -> None:
    """The `completed` webhook of jobs the response cache answered at submit."""
    ended = [
        row["id"]
        for row in rows
        if row["id"] in answered and webhooks.wants(row["webhook_events"], webhooks.Event.COMPLETED)
    ]
    webhooks.record(session=session, event=webhooks.Event.COMPLETED, job_ids=ended, at=now)


def _tenant_key(row: Mapping[str, Any] | RowMapping) -> tuple[str, str]:
    return row["tenant"], row["idempotency_key"]


# What a row the response cache answered sets beyond a queued one (db/cache.py `answer`).
_ANSWERED = {"outputs": None, "cached": False, "started_at": None, "finished_at": None}


def _uniform(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with the same keys, for one executemany INSERT, when the cache answered some."""
    if all(len(row) == len(rows[0]) for row in rows):
        return rows
    return [{**_ANSWERED, **row} for row in rows]


def _row(job: NewJob, now: datetime) -> dict[str, Any]:
    """The `jobs` row of a new job (its inputs go to `job_inputs`)."""
    return {
        "id": new_job_id(),
        "tenant": job.tenant,
        "model": job.model,
        "version": job.version,
        "status": JobStatus.QUEUED.value,
        "priority": job.priority,
        "samples": job.samples,
        "attempts": 0,
        "idempotency_key": job.idempotency_key,
        "request_hash": job.request_hash,
        "ttl_s": job.ttl_s,
        "created_at": now,
        "cache_key": job.cache_key,
        "deadline_at": _deadline(now, job.cancel_after_s),
        "webhook": job.webhook,
        "webhook_events": job.webhook_events,
    }


def _deadline(now: datetime, cancel_after_s: float | None) -> datetime | None:
    return None if cancel_after_s is None else now + timedelta(seconds=cancel_after_s)


def _insert_unless_key_taken(session: Session) -> Any:
    dialect = session.get_bind().dialect.name
    unique = [_jobs.c.tenant, _jobs.c.idempotency_key]
    if dialect == "postgresql":
        return pg_insert(_jobs).on_conflict_do_nothing(index_elements=unique)
    if dialect == "sqlite":
        return sqlite_insert(_jobs).on_conflict_do_nothing(index_elements=unique)
    raise NotImplementedError(f"idempotent submit is not implemented for {dialect}")


# ─── Claim ────────────────────────────────────────────────────────────────────────────────────────


@functools.cache
def _claim_statement(*, fresh_only: bool, history: bool = True) -> Update:
    """The compare-and-set that claims jobs: only rows still queued (and, `fresh_only`, never
    claimed) move, so of two racing claimers exactly one wins each job (PostgreSQL re-checks
    the WHERE after a concurrent update; SQLite serializes writers). Built once: building a
    statement costs more than running it."""
    where = [_jobs.c.id.in_(bindparam("c_ids", expanding=True)), _QUEUED, _BEFORE_DEADLINE]
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
            _jobs.c.webhook_events,
        )
    )


# A claim never starts a job past its deadline: `_claim_ids` cancels it instead.
_BEFORE_DEADLINE = or_(_jobs.c.deadline_at.is_(None), _jobs.c.deadline_at > bindparam("c_now"))


_SELECT_INPUTS = select(_inputs.c.job_id, _inputs.c.data).where(
    _inputs.c.job_id.in_(bindparam("c_ids", expanding=True))
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
    """Claim the named jobs; those past their deadline are canceled instead, and their ids
    appended to `canceled` (for the caller to announce once this transaction commits)."""
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
    if len(rows) < len(job_ids):  # taken by another claimer, ended, or past its deadline
        claimed = {row.id for row in rows}
        late = cancel_overdue(
            session=session, now=now, among=[i for i in job_ids if i not in claimed], queued=True
        )
        if canceled is not None:
            canceled.extend(late)
    started = [row.id for row in rows if webhooks.wants(row.webhook_events, webhooks.Event.START)]
    webhooks.record(session=session, event=webhooks.Event.START, job_ids=started, at=now)
    inputs: dict[str, bytes] = (
        dict(session.execute(_SELECT_INPUTS, {"c_ids": [row.id for row in rows]}).all())
        if rows
        else {}
    )
    return [
        Lease(
            job_id=row.id,
            owner=owner,
            attempt=row.attempts,
            samples=row.samples,
            priority=row.priority,
            inputs=inputs.get(row.id, b""),
            created_at=row.created_at,
            started_at=now,
            parent_id=row.parent_id,
            cache_key=row.cache_key,
            deadline_at=row.deadline_at,
            webhook_events=row.webhook_events,
        )
        for row in rows
    ]


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
    Those past their deadline are canceled: their ids go to `canceled`, to be announced."""
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


def _waiting(*, fresh_only: bool) -> list[ColumnElement[bool]]:
    """Queued jobs of the model version bound as `n_model`, `n_version`."""
    where = [
        _jobs.c.model == bindparam("n_model"),
        _jobs.c.version == bindparam("n_version"),
        _QUEUED,
    ]
    return [*where, _NEVER_CLAIMED] if fresh_only else where


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
    """One tenant's queued jobs of a model version, by priority then age."""
    return (
        select(_jobs.c.id, _jobs.c.samples)
        .where(_jobs.c.tenant == bindparam("n_tenant"), *_waiting(fresh_only=fresh_only))
        .order_by(_jobs.c.priority.desc(), _jobs.c.id)
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
    wait take turns (fair share, weighted), and a tenant's own jobs go by priority, then age.

    A job larger than `max_samples` is taken only alone (the worker runs it in chunks), and only
    with `take_oversized` (a caller that already holds jobs passes False: it has room for less).
    With `fresh_only`, only jobs never claimed in this run. A chosen job past its deadline is
    canceled instead of claimed; its id goes to `canceled` (for the caller to announce).
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
    leases = _claim_ids(
        session=session,
        job_ids=chosen,
        owner=owner,
        lease_s=lease_s,
        worker=worker or owner,
        canceled=canceled,
    )
    rank = {job_id: i for i, job_id in enumerate(chosen)}
    return sorted(leases, key=lambda lease: rank[lease.job_id])


@dataclass
class _TenantQueue:
    weight: int
    rows: deque[Row[tuple[str, int]]]  # (id, samples): its queued jobs, by priority then age
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
    one past its deadline is canceled instead, its id put in `canceled` (to be announced)."""
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


# ─── Heartbeat ────────────────────────────────────────────────────────────────────────────────────


def _fenced() -> ColumnElement[bool]:
    return and_(
        _jobs.c.id == bindparam("b_id"),
        _jobs.c.status == JobStatus.RUNNING.value,
        _jobs.c.lease_owner == bindparam("b_owner"),
        _jobs.c.attempts == bindparam("b_attempt"),
    )


def _fence(lease: Lease, **extra: object) -> dict[str, object]:
    return {"b_id": lease.job_id, "b_owner": lease.owner, "b_attempt": lease.attempt, **extra}


def _fenced_statement(**values: object) -> Update:
    """An UPDATE of one job, only while its lease still matches (see `_fence`)."""
    return update(_jobs).where(_fenced()).values(**values)


def _fenced_update(session: Session, stmt: Update, params: list[dict[str, object]]) -> int:
    """`stmt` once per lease, in one round of executemany; returns how many rows matched."""
    # Rows locked in id order, the order a multi-row UPDATE by id takes them: two transactions
    # touching the same jobs then wait for each other instead of deadlocking.
    params = sorted(params, key=lambda p: str(p["b_id"]))
    result = session.execute(stmt, params)
    return int(result.rowcount)  # type: ignore[attr-defined]


def heartbeat(*, session: Session, leases: Sequence[Lease], lease_s: float) -> int:
    """Extend the leases still held; returns how many were."""
    if not leases:
        return 0
    expires = clock.now(session) + timedelta(seconds=lease_s)
    return _fenced_update(
        session,
        _fenced_statement(lease_expires_at=bindparam("b_expires")),
        [_fence(lease, b_expires=expires) for lease in leases],
    )


# ─── End ──────────────────────────────────────────────────────────────────────────────────────────


@functools.cache
def _complete_statement() -> Update:
    # Built once, as the claim is: the hot path runs it for every batch.
    return _fenced_statement(
        status=JobStatus.SUCCEEDED.value,
        outputs=bindparam("b_outputs"),
        finished_at=bindparam("b_now"),
        lease_owner=None,
        lease_expires_at=None,
    )


def complete(
    *, session: Session, results: Sequence[tuple[Lease, bytes]], now: datetime | None = None
) -> int:
    """Write outputs where the lease still matches; returns how many were written.

    `now`: the `finished_at` to store, when the caller must know it exactly."""
    if not results:
        return 0
    now = now or clock.now(session)
    # Outputs are the inputs' whatever the fence says: cached even where a late one is dropped.
    cache.remember(
        session=session,
        entries=[(lease.cache_key, out) for lease, out in results if lease.cache_key],
        now=now,
    )
    written = _fenced_update(
        session,
        _complete_statement(),
        [_fence(lease, b_outputs=outputs, b_now=now) for lease, outputs in results],
    )
    _record_ended(session, [lease for lease, _ in results], now)
    return written


def _record_ended(session: Session, leases: Sequence[Lease], now: datetime) -> None:
    """The `completed` webhook of held jobs this transaction ended at `now` (a lease that no
    longer matched ended nothing: `record` finds no job that ended at `now`)."""
    ended = [
        lease.job_id
        for lease in leases
        if webhooks.wants(lease.webhook_events, webhooks.Event.COMPLETED)
    ]
    webhooks.record(session=session, event=webhooks.Event.COMPLETED, job_ids=ended, at=now)


def fail(*, session: Session, leases: Sequence[Lease], code: JobErrorCode, message: str) -> int:
    """End held jobs `failed` with an error code; returns how many were."""
    if not leases:
        return 0
    now = clock.now(session)
    failed = _fenced_update(
        session,
        _fenced_statement(
            status=JobStatus.FAILED.value,
            error_code=JobErrorCode(code).value,
            error_message=message,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        ),
        [_fence(lease) for lease in leases],
    )
    _record_ended(session, leases, now)
    return failed


def release(*, session: Session, leases: Sequence[Lease]) -> int:
    """Hand held jobs back to the queue (an infrastructure fault, not the job's)."""
    if not leases:
        return 0
    logged = _logged("requeued", clock.now(session), "handed back by its worker")
    return _fenced_update(
        session,
        _fenced_statement(
            status=JobStatus.QUEUED.value, lease_owner=None, lease_expires_at=None, history=logged
        ),
        [_fence(lease) for lease in leases],
    )


def unclaim(*, session: Session, leases: Sequence[Lease]) -> int:
    """Undo the claim of jobs whose batch never started (the worker began shutting down while it
    claimed them): queued again as if never claimed, so they are not taken for jobs that may have
    killed a child and run alone. Fenced: a lease that no longer matches changes nothing."""
    if not leases:
        return 0
    return _fenced_update(
        session,
        _fenced_statement(
            status=JobStatus.QUEUED.value,
            attempts=_jobs.c.attempts - 1,
            lease_owner=None,
            lease_expires_at=None,
            worker=None,
            started_at=None,
            history=_logged(
                "put back", clock.now(session), "its worker began shutting down before it ran"
            ),
        ),
        [_fence(lease) for lease in leases],
    )


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
    # Locked in id order, skipping rows a worker is writing now, as `_take_back` does.
    ids = list(
        session.scalars(
            select(_jobs.c.id)
            .where(*overdue)
            .order_by(_jobs.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )
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
    return sorted(row.id for row in canceled)


def _record_rows_ended(session: Session, rows: Sequence[Row[Any]], now: datetime) -> None:
    """The `completed` webhook of jobs an UPDATE ... RETURNING (id, webhook_events) ended."""
    ended = [row.id for row in rows if webhooks.wants(row.webhook_events, webhooks.Event.COMPLETED)]
    webhooks.record(session=session, event=webhooks.Event.COMPLETED, job_ids=ended, at=now)


# ─── Retry and delete ─────────────────────────────────────────────────────────────────────────────


def retry(
    *, session: Session, job_id: str, tenant: str | None = None, cancel_after_s: float | None = None
) -> Job:
    """Queue a failed or canceled job (of `tenant`, unless None) again under its id: its error,
    outputs, lease and split parts cleared, a fresh attempt budget, a new deadline (or none).

    `attempts` goes on counting (the job's history, and the fence: a late result of an earlier
    run carries an older attempt number and matches nothing). The caller publishes its wake-up.
    """
    job = get(session=session, job_id=job_id, tenant=tenant)
    if job.parent_id is not None:
        raise JobNotRetryable(f"job {job_id!r} is a part of job {job.parent_id!r}; retry that")
    if job.status not in _RETRYABLE:
        raise JobNotRetryable(_not_retryable(job_id, job.status))
    if session.scalar(select(_inputs.c.job_id).where(_inputs.c.job_id == job_id)) is None:
        raise InputsGone(
            f"job {job_id!r}: its inputs are no longer stored (a job split into parts before "
            "tffleet kept them), so it cannot run again; submit it anew"
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
    # A split job runs whole again: the parts of its last run go (their inputs with them).
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
    # Its parts (and every row's inputs) go with it: ON DELETE CASCADE.
    result = session.execute(delete(_jobs).where(_jobs.c.id == job_id, _jobs.c.status.in_(ended)))
    if not result.rowcount:  # type: ignore[attr-defined]
        job = get(session=session, job_id=job_id, tenant=tenant)
        raise JobNotEnded(
            f"job {job_id!r} is {job.status}: cancel it first (POST /v1/jobs/{job_id}/cancel), "
            "then delete it"
        )
    if job.cache_key:
        cache.forget(session=session, keys=[job.cache_key])


# ─── Sweep ────────────────────────────────────────────────────────────────────────────────────────
# The sweeper's side of the state machine: leases whose worker vanished, wake-ups that were lost,
# results past their retention.


JobGroups = dict[tuple[str, int], list[str]]
"""Job ids by (model, version): what one wake-up message can name."""


@dataclass(frozen=True)
class TakenBack:
    requeued: JobGroups  # back to queued, to be published again
    failed: list[str]  # ended `worker_lost`: their attempt budget is used

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.requeued.values()) + len(self.failed)


def expire_leases(
    *, session: Session, now: datetime | None = None, max_attempts: int, limit: int = 1000
) -> TakenBack:
    """Take back running jobs whose lease ran out before `now` (at most `limit` of them).

    A job that has been claimed `max_attempts` times ends `failed` (`worker_lost`), so a job that
    kills its worker cannot loop forever; the others go back to `queued`. Each row moves only if
    it is still running on an expired lease when the UPDATE reaches it, so a heartbeat or a
    result that lands first wins, and a result that lands later no longer matches its fence.
    """
    now = now or clock.now(session)
    return _take_back(
        session,
        (_jobs.c.lease_expires_at < now,),
        now=now,
        max_attempts=max_attempts,
        limit=limit,
        lost="each attempt's lease expired without a result",
    )


def take_back_from(
    *, session: Session, owner_prefix: str, max_attempts: int, limit: int = 1000
) -> TakenBack:
    """Take back the running jobs of lease owners whose id starts with `owner_prefix`: a worker
    child that is known to be dead (its main process saw it go), whatever its leases' expiry.
    The attempt budget applies as in `expire_leases`."""
    return _take_back(
        session,
        (_jobs.c.lease_owner.startswith(owner_prefix, autoescape=True),),
        now=clock.now(session),
        max_attempts=max_attempts,
        limit=limit,
        lost="each attempt's worker died or its lease expired without a result",
    )


def _take_back(
    session: Session,
    lost_lease: tuple[ColumnElement[bool], ...],
    *,
    now: datetime,
    max_attempts: int,
    limit: int,
    lost: str,
) -> TakenBack:
    held = (_jobs.c.status == JobStatus.RUNNING.value, *lost_lease)
    # Claims since a client last retried the job (`retry`); `attempts` alone, if never.
    used = _jobs.c.attempts - _jobs.c.budget_from
    # Lock in id order (as `_fenced_update` does) and skip rows a worker is writing right now:
    # they no longer qualify once it commits, or are picked up by the next call.
    rows = session.execute(
        select(_jobs.c.id, used.label("used"))
        .where(*held)
        .order_by(_jobs.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    if not rows:
        return TakenBack(requeued={}, failed=[])
    cleared = {"lease_owner": None, "lease_expires_at": None}
    failed: list[str] = []
    for attempts in sorted({row.used for row in rows if row.used >= max_attempts}):
        ids = [row.id for row in rows if row.used == attempts]
        lost_rows = session.execute(
            update(_jobs)
            .where(_jobs.c.id.in_(ids), used == attempts, *held)
            .values(
                status=JobStatus.FAILED.value,
                error_code=JobErrorCode.WORKER_LOST.value,
                error_message=(
                    f"worker lost {attempts} times: {lost} (TFFLEET_MAX_ATTEMPTS={max_attempts})"
                ),
                finished_at=now,
                **cleared,
            )
            .returning(_jobs.c.id, _jobs.c.webhook_events)
        ).all()
        _record_rows_ended(session, lost_rows, now)
        failed += [row.id for row in lost_rows]
    again = [row.id for row in rows if row.used < max_attempts]
    requeued: JobGroups = {}
    if again:
        moved = session.execute(
            update(_jobs)
            .where(_jobs.c.id.in_(again), used < max_attempts, *held)
            .values(
                status=JobStatus.QUEUED.value, history=_logged("requeued", now, lost), **cleared
            )
            .returning(_jobs.c.id, _jobs.c.model, _jobs.c.version)
        ).all()
        for row in sorted(moved, key=lambda row: row.id):
            requeued.setdefault((row.model, row.version), []).append(row.id)
    return TakenBack(requeued=requeued, failed=sorted(failed))


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


def purge_finished(
    *, session: Session, older_than: datetime, limit: int, now: datetime | None = None
) -> int:
    """Delete at most `limit` ended jobs past their retention; returns how many.

    That is: jobs without a `ttl_s` that finished before `older_than`, and jobs with one whose
    `expires_at` (see `stamp_expiry`) is before `now`. One bounded chunk per call, so the caller
    can commit between chunks and no transaction holds a large part of the table.
    """
    now = now or clock.now(session)
    ended = _jobs.c.status.in_([status.value for status in FINISHED])
    by_default = select(_jobs.c.id).where(
        ended, _jobs.c.ttl_s.is_(None), _jobs.c.finished_at < older_than
    )
    by_own = select(_jobs.c.id).where(ended, _jobs.c.expires_at < now)
    ids = list(session.scalars(by_default.order_by(_jobs.c.finished_at).limit(limit)))
    ids += list(session.scalars(by_own.order_by(_jobs.c.expires_at).limit(limit - len(ids))))
    if not ids:
        return 0
    result = session.execute(delete(_jobs).where(_jobs.c.id.in_(ids)))
    return int(result.rowcount)  # type: ignore[attr-defined]


# ─── Reads ────────────────────────────────────────────────────────────────────────────────────────


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
) -> tuple[list[Job], str | None]:
    """Newest first, of one tenant (None: every tenant's). `cursor` is the `next_cursor` of the
    previous page (the last id it held)."""
    if limit < 1:
        raise InvalidRequest(f"limit: must be at least 1, got {limit}")
    # The parts of split jobs are the fleet's, not the client's (db/parts.py).
    query = select(Job).where(Job.parent_id.is_(None)).order_by(Job.id.desc()).limit(limit + 1)
    if tenant is not None:
        query = query.where(Job.tenant == tenant)
    if status is not None:
        query = query.where(Job.status == status.value)
    if model is not None:
        query = query.where(Job.model == model)
    if cursor is not None:
        try:
            # Ids compare as strings: "{...}", upper case or unhyphenated spellings of the same
            # UUID would page from the wrong place, so compare the canonical form.
            canonical = str(uuid.UUID(cursor))
        except ValueError:
            raise InvalidRequest(f"cursor: {cursor!r} is not a cursor this API returned") from None
        query = query.where(Job.id < canonical)
    jobs = list(session.scalars(query))
    next_cursor = jobs[limit - 1].id if len(jobs) > limit else None
    return jobs[:limit], next_cursor
