"""A job's start: `queued` rows (or rows the response cache answered at once), inserted in one
statement and committed before any wake-up is published; a keyed request's jobs stored once.

Called by the API (api/ingest.py), for every way of submitting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, RowMapping, delete, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db import cache, clock, objects, webhooks
from db.ids import new_job_id
from db.jobs._common import _deadline, _inputs, _jobs, _pick_deadline
from db.models import DEFAULT_TENANT, Job, JobStatus
from tffleet.errors import IdempotencyKeyReused, ServiceUnavailable, TffleetError


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
    # `Queue-Timeout`: not started this many seconds after it is stored, it is canceled.
    queue_timeout_s: float | None = None
    # Its webhook and the events it asked for (bits of `db.webhooks.Event`); see db/webhooks.py.
    webhook: str | None = None
    webhook_events: int | None = None
    # Made by the caller when it must know the id before the row exists (large inputs written
    # to the store under it first); else made here.
    id: str | None = None
    # Bytes of its own in the object store (large inputs), and the uploads its inputs name,
    # pinned to it in the transaction that stores it (db/objects.py).
    stored_bytes: int | None = None
    uploads: tuple[str, ...] = ()
    # What its request hash and cache key read in place of `inputs`, where those hold
    # references to objects of its own (whose keys name the job, not the bytes): a digest of
    # the inputs' bytes.
    content: bytes | None = None


@dataclass(frozen=True)
class Submitted:
    """A keyed request's jobs, in its order, as stored now: by this call, or by an earlier one."""

    jobs: list[Row[Any]]  # every column but inputs and outputs
    created: list[str]  # the ids this call stored, to be published; empty for a replay

    @property
    def replayed(self) -> bool:
        return not self.created


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
        _pin(session, [(row["id"], job) for row, job in zip(rows, jobs, strict=True)], answered)
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
    made = zip(_flat(requests), _flat_rows(per_request), strict=True)
    _pin(session, [(row["id"], job) for job, row in made if row["id"] in inserted], answered)
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


def _flat(requests: Sequence[Sequence[NewJob]]) -> list[NewJob]:
    return [job for request in requests for job in request]


def _flat_rows(per_request: Sequence[Sequence[tuple[dict[str, Any], bytes]]]) -> list[Any]:
    return [row for rows in per_request for row, _ in rows]


def _pin(session: Session, made: Sequence[tuple[str, NewJob]], answered: set[str]) -> None:
    """Pin the uploads each new job's inputs name (a job the cache answered keeps none)."""
    for job_id, job in made:
        if job.uploads and job_id not in answered:
            objects.pin_uploads(session=session, job_id=job_id, upload_ids=job.uploads)


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
    deadline_at = _deadline(now, job.cancel_after_s)
    return {
        "id": job.id or new_job_id(),
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
        "deadline_at": deadline_at,
        "pick_deadline": _pick_deadline(deadline_at),
        "queue_timeout_at": _deadline(now, job.queue_timeout_s),
        "webhook": job.webhook,
        "webhook_events": job.webhook_events,
        "stored_bytes": job.stored_bytes,
    }


def _insert_unless_key_taken(session: Session) -> Any:
    dialect = session.get_bind().dialect.name
    unique = [_jobs.c.tenant, _jobs.c.idempotency_key]
    if dialect == "postgresql":
        return pg_insert(_jobs).on_conflict_do_nothing(index_elements=unique)
    if dialect == "sqlite":
        return sqlite_insert(_jobs).on_conflict_do_nothing(index_elements=unique)
    raise NotImplementedError(f"idempotent submit is not implemented for {dialect}")
