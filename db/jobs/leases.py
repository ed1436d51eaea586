"""A job's lease, from its claim to its end: the `Lease` a claim hands out; `heartbeat`, which
extends it while the batch runs; `complete`, `fail`, `release` and `unclaim`, which write only
where the lease still matches (owner and attempt), so a stale or duplicate worker cannot
overwrite a result; and the take-back of leases whose worker is gone: `expire_leases` (the lease
ran out) and `take_back_from` (the child is known dead), `queued` again or `failed`
(`worker_lost`) once the attempt budget is used.

Called by worker children (the heartbeat thread, the batch's writer), the sweeper
(`expire_leases`) and a worker's main process (`take_back_from`, worker/orphans.py).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Update, and_, bindparam, func, select, update
from sqlalchemy.orm import Session

from db import cache, clock, transforms, webhooks
from db.jobs._common import JobGroups, _jobs, _record_rows_ended
from db.jobs.history import _logged
from db.models import JobErrorCode, JobStatus


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
    queue_timeout_at: datetime | None = None  # as stored (`Queue-Timeout`), likewise
    webhook_events: int | None = None  # its webhook's events: its end is recorded for them
    tenant: str | None = None  # whose job: its objects in the store lie under the tenant's prefix


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


def progress(*, session: Session, lease: Lease, samples_done: int, lease_s: float) -> bool:
    """Record how far a held job has come (`samples_done`: a transform's shard, record by
    record) and extend its lease; False when the lease no longer holds (the job was canceled,
    or taken back): its worker stops there, as it would learn nothing more by going on."""
    expires = clock.now(session) + timedelta(seconds=lease_s)
    statement = _fenced_statement(
        samples_done=bindparam("b_done"), lease_expires_at=bindparam("b_expires")
    )
    return bool(
        _fenced_update(session, statement, [_fence(lease, b_done=samples_done, b_expires=expires)])
    )


# ─── End ──────────────────────────────────────────────────────────────────────────────────────────


@functools.cache
def _complete_statement() -> Update:
    # Built once, as the claim is: the hot path runs it for every batch.
    return _fenced_statement(
        status=JobStatus.SUCCEEDED.value,
        outputs=bindparam("b_outputs"),
        finished_at=bindparam("b_now"),
        # Null stays null (the job owns no object) where nothing was stored: NULL + 0 is NULL;
        # a job that stored outputs was set to at least 0 first (`reserve_storage`).
        stored_bytes=_jobs.c.stored_bytes + bindparam("b_stored"),
        device_s=_device_s(),
        lease_owner=None,
        lease_expires_at=None,
    )


def _device_s() -> ColumnElement[float]:
    """The job's device seconds plus this batch's share (`b_device`): an earlier attempt's
    forward passes (a job failed, then retried) count too."""
    return func.coalesce(_jobs.c.device_s, 0.0) + bindparam("b_device")


def complete(
    *,
    session: Session,
    results: Sequence[tuple[Lease, bytes]],
    now: datetime | None = None,
    stored: Mapping[str, int] | None = None,
    device_s: Mapping[str, float] | None = None,
) -> int:
    """Write outputs where the lease still matches; returns how many were written.

    `now`: the `finished_at` to store, when the caller must know it exactly. `stored`: by job
    id, the bytes of the outputs its worker wrote to the object store (under a
    `reserve_storage` of the same lease), added to the job's `stored_bytes`. `device_s`: by job
    id, its share of the batch's forward passes (worker/pipeline.py), added to its `device_s`:
    in the same UPDATE, no statement more."""
    if not results:
        return 0
    now = now or clock.now(session)
    stored = stored or {}
    device_s = device_s or {}
    # Outputs are the inputs' whatever the fence says: cached even where a late one is dropped.
    # Not outputs that point into the store: those objects go with their job (DELETE, ttl), and
    # a cached reference would outlive them.
    cache.remember(
        session=session,
        entries=[
            (lease.cache_key, out)
            for lease, out in results
            if lease.cache_key and lease.job_id not in stored
        ],
        now=now,
    )
    written = _fenced_update(
        session,
        _complete_statement(),
        [
            _fence(
                lease,
                b_outputs=outputs,
                b_now=now,
                b_stored=stored.get(lease.job_id, 0),
                b_device=device_s.get(lease.job_id, 0.0),
            )
            for lease, outputs in results
        ],
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


def fail(
    *,
    session: Session,
    leases: Sequence[Lease],
    code: JobErrorCode,
    message: str,
    device_s: Mapping[str, float] | None = None,
) -> int:
    """End held jobs `failed` with an error code; returns how many were. `device_s`: by job
    id, the forward passes' seconds it took before it failed (as `complete`'s)."""
    if not leases:
        return 0
    now = clock.now(session)
    device_s = device_s or {}
    failed = _fenced_update(
        session,
        _fenced_statement(
            status=JobStatus.FAILED.value,
            error_code=JobErrorCode(code).value,
            error_message=message,
            finished_at=now,
            device_s=_device_s(),
            lease_owner=None,
            lease_expires_at=None,
        ),
        [_fence(lease, b_device=device_s.get(lease.job_id, 0.0)) for lease in leases],
    )
    _record_ended(session, leases, now)
    if failed:  # a transform's shards among them count as failed for good (db/transforms.py)
        transforms.shard_failed(session, [lease.job_id for lease in leases])
    return failed


def reserve_storage(*, session: Session, leases: Sequence[Lease]) -> list[Lease]:
    """Mark held jobs as owning objects in the store (`stored_bytes` at least 0) before their
    worker writes any: whoever deletes a job row with `stored_bytes` set deletes its prefix too,
    so a crash between the write and `complete` leaves no object that nothing accounts for.
    Returns the leases that still held (one fenced UPDATE each: their objects may be written)."""
    statement = _fenced_statement(stored_bytes=func.coalesce(_jobs.c.stored_bytes, 0))
    held = []
    for lease in sorted(leases, key=lambda lease: lease.job_id):  # id order, as `_fenced_update`
        if _fenced_update(session, statement, [_fence(lease)]):
            held.append(lease)
    return held


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


def unclaim(
    *,
    session: Session,
    leases: Sequence[Lease],
    reason: str = "its worker began shutting down before it ran",
) -> int:
    """Undo the claim of jobs whose batch never started (the worker began shutting down while it
    claimed them, the object store did not answer): queued again as if never claimed, so they
    are not taken for jobs that may have killed a child and run alone, and cost no attempt.
    Fenced: a lease that no longer matches changes nothing. `reason` goes to their history."""
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
            history=_logged("put back", clock.now(session), reason),
        ),
        [_fence(lease) for lease in leases],
    )


# ─── Take back ────────────────────────────────────────────────────────────────────────────────────
# Leases whose worker is gone: run out (the sweeper), or held by a child that its worker's main
# process saw die.


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
        transforms.shard_failed(session, [row.id for row in lost_rows])
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
