"""A transform's life, as its client steers it: `create` (the row and all its shard jobs, in one
transaction), the reads the API answers with (`get`, `list_transforms`, `running`), `cancel`
(queued shards never start, running ones lose their lease and stop at a batch boundary) and
`retry` (its failed or canceled shards only, under their ids, through db.jobs `retry`).

How a shard's end counts into its transform is db/transforms.py; this module plans the shards
and writes their specs (`plan_shards`, `shard_jobs`). Called by the API (api/routes/transforms.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, case, func, insert, select, update
from sqlalchemy.orm import Session

from db import clock, jobs, webhooks
from db.ids import cursor_id, new_job_id
from db.models import Job, JobInput, JobStatus, Transform, TransformStatus
from db.transform_keys import find_keyed, insert_unless_key_taken
from db.transform_views import Running, part_uri, shard_errors_uri, transform_out
from db.transforms import pack_shard_spec
from tffleet.errors import Conflict, InvalidRequest, NotFound, ServiceUnavailable

_jobs: Table = Job.__table__  # type: ignore[assignment]
_inputs: Table = JobInput.__table__  # type: ignore[assignment]
_transforms: Table = Transform.__table__  # type: ignore[assignment]

_OPEN = (TransformStatus.QUEUED.value, TransformStatus.RUNNING.value)
_UNFINISHED = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
_RETRYABLE = (JobStatus.FAILED.value, JobStatus.CANCELED.value)


@dataclass(frozen=True)
class Shard:
    """Records `start` to `stop` (exclusive) of input file `file` (its index in `files`)."""

    file: int
    start: int
    stop: int


def plan_shards(records_per_file: Sequence[int], shard_records: int) -> list[Shard]:
    """The shards of files of these record counts: each file cut into ranges of at most
    `shard_records`, in input order (so part k holds the outputs of records before part k+1's).
    A shard never spans two files: each reads one file from one offset. An empty file has none."""
    if shard_records < 1:
        raise ValueError(f"shard_records must be at least 1, got {shard_records}")
    return [
        Shard(file=index, start=start, stop=min(start + shard_records, records))
        for index, records in enumerate(records_per_file)
        for start in range(0, records, shard_records)
    ]


@dataclass(frozen=True)
class NewTransform:
    """A transform checked by the API, ready to store: its input files with their `FileInfo`
    JSON (`files`: [{"uri", "format", "info"}]), where its outputs go, and how it is cut."""

    tenant: str
    model: str
    version: int
    priority: int
    spec: dict[str, Any]  # {"input": {uri, format, columns, key}, "output": {uri, format}, ...}
    files: list[dict[str, Any]]
    output_uri: str
    errors_uri: str
    shard_records: int
    batch_records: int
    webhook: str | None = None
    webhook_events: int | None = None
    id: str | None = None  # made here unless the caller needed it first (its default output)
    # Set together: its request's Idempotency-Key and that request's hash (`find_keyed`).
    idempotency_key: str | None = None
    request_hash: str | None = None


def create(*, session: Session, new: NewTransform) -> tuple[Transform, list[str]]:
    """Insert the transform and one queued job per shard (their inputs: shard specs); returns
    the transform and its shard job ids, to publish once the transaction commits.

    A keyed transform whose key the tenant used already (a request racing this one with the
    same key, committed first) is not inserted: the stored one is returned with no shard ids,
    or `IdempotencyKeyReused` raised (`find_keyed`)."""
    now = clock.now(session)
    transform_id = new.id or new_job_id()
    shards = plan_shards([int(f["info"]["records"]) for f in new.files], new.shard_records)
    row = {
        "id": transform_id,
        "tenant": new.tenant,
        "model": new.model,
        "version": new.version,
        "status": TransformStatus.QUEUED.value,
        "priority": new.priority,
        "spec": new.spec,
        "files": new.files,
        "output_uri": new.output_uri,
        "errors_uri": new.errors_uri,
        "records": sum(shard.stop - shard.start for shard in shards),
        "records_succeeded": 0,
        "records_failed": 0,
        "shards_total": len(shards),
        "shards_done": 0,
        "shards_failed": 0,
        "webhook": new.webhook,
        "webhook_events": new.webhook_events,
        "created_at": now,
        "idempotency_key": new.idempotency_key,
        "request_hash": new.request_hash,
    }
    stored = _insert(session, new, row)
    if stored is not None:  # its key's request, stored before: nothing is added
        return stored, []
    job_rows, input_rows = shard_jobs(new, transform_id, shards, now)
    if job_rows:
        session.execute(insert(_jobs), job_rows)
        session.execute(insert(_inputs), input_rows)
    if not shards:  # nothing to read: it ended as it began
        session.execute(
            update(_transforms)
            .where(_transforms.c.id == transform_id)
            .values(status=TransformStatus.SUCCEEDED.value, started_at=now, finished_at=now)
        )
        if webhooks.wants(new.webhook_events, webhooks.Event.COMPLETED):
            webhooks.record_transform(session=session, transform_id=transform_id, at=now)
    return get(session=session, transform_id=transform_id), [r["id"] for r in job_rows]


def _insert(session: Session, new: NewTransform, row: dict[str, Any]) -> Transform | None:
    """Insert the transform's row; for a keyed one whose key is taken, insert nothing and
    return the transform stored under it (or raise, `find_keyed`)."""
    key = new.idempotency_key
    if key is None:
        session.execute(insert(_transforms), [row])
        return None
    statement = insert_unless_key_taken(session).values(row).returning(_transforms.c.id)
    if session.scalar(statement) is not None:
        return None
    stored = find_keyed(session=session, tenant=new.tenant, key=key, request_hash=new.request_hash)
    if stored is None:  # deleted between the INSERT and the SELECT
        raise ServiceUnavailable(
            f"Idempotency-Key {key!r}: its transform was deleted while this request ran; try again"
        )
    return stored


def shard_jobs(
    new: NewTransform, transform_id: str, shards: Sequence[Shard], now: datetime
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The `jobs` and `job_inputs` rows of a transform's shards: ordinary queued jobs of its
    model, tenant and priority, `samples` their records, inputs their shard specs."""
    output = new.spec["output"]
    source = new.spec["input"]
    job_rows, input_rows = [], []
    for number, shard in enumerate(shards):
        file = new.files[shard.file]
        spec = {
            "transform": transform_id,
            "shard": number,
            "file": {"uri": file["uri"], "format": file["format"], "info": file["info"]},
            "start": shard.start,
            "stop": shard.stop,
            "columns": source.get("columns"),
            "key": source.get("key"),
            "output": {"uri": new.output_uri, "format": output["format"]},
            "part_uri": part_uri(new.output_uri, number, output["format"]),
            "errors_uri": shard_errors_uri(new.output_uri, number),
            "batch_records": new.batch_records,
        }
        job_id = new_job_id()
        job_rows.append(
            {
                "id": job_id,
                "tenant": new.tenant,
                "model": new.model,
                "version": new.version,
                "status": JobStatus.QUEUED.value,
                "priority": new.priority,
                "samples": shard.stop - shard.start,
                "created_at": now,
                "transform_id": transform_id,
                "shard": number,
            }
        )
        input_rows.append({"job_id": job_id, "data": pack_shard_spec(spec)})
    return job_rows, input_rows


# ─── Reads ────────────────────────────────────────────────────────────────────────────────────────


def get(*, session: Session, transform_id: str, tenant: str | None = None) -> Transform:
    """A transform by id; another tenant's is not found (unless `tenant` is None: any tenant's)."""
    found = session.get(Transform, transform_id, populate_existing=True)
    if found is None or (tenant is not None and found.tenant != tenant):
        raise NotFound(f"transform {transform_id!r} not found")
    return found


def running(*, session: Session, transform: Transform) -> Running:
    """Its running shards and the records they did (heartbeats' `samples_done`), its first
    shard's start, its shards' device seconds, and which shards' parts are written: one
    aggregate and one index read."""
    runs = _jobs.c.status == JobStatus.RUNNING.value
    row = session.execute(
        select(
            func.coalesce(func.sum(case((runs, 1), else_=0)), 0),
            func.coalesce(func.sum(case((runs, _jobs.c.samples_done), else_=0)), 0),
            func.coalesce(func.sum(_jobs.c.device_s), 0.0),  # its `usage` (db/usage.py)
        ).where(_jobs.c.transform_id == transform.id)
    ).one()
    started = None
    if transform.started_at is None:
        started = session.scalar(
            select(func.min(_jobs.c.started_at)).where(_jobs.c.transform_id == transform.id)
        )
    parts = session.scalars(
        select(_jobs.c.shard)
        .where(
            _jobs.c.transform_id == transform.id,
            _jobs.c.status == JobStatus.SUCCEEDED.value,
            _jobs.c.samples_done > 0,  # a shard of no good record wrote no part
        )
        .order_by(_jobs.c.shard)
    )
    return Running(
        shards=int(row[0]),
        records_done=int(row[1]),
        parts=tuple(int(shard) for shard in parts),
        started_at=started,
        device_s=float(row[2]),
    )


def list_transforms(
    *, session: Session, tenant: str | None, limit: int = 50, cursor: str | None = None
) -> tuple[list[Transform], str | None]:
    """Newest first, of one tenant (None: every tenant's); `cursor` as the jobs' listing has."""
    if limit < 1:
        raise InvalidRequest(f"limit: must be at least 1, got {limit}")
    query = select(Transform).order_by(Transform.id.desc()).limit(limit + 1)
    if tenant is not None:
        query = query.where(Transform.tenant == tenant)
    if cursor is not None:
        query = query.where(Transform.id < cursor_id(cursor))
    found = list(session.scalars(query.execution_options(populate_existing=True)))
    next_cursor = found[limit - 1].id if len(found) > limit else None
    return found[:limit], next_cursor


def recent(*, session: Session, now: datetime, limit: int = 20) -> list[dict[str, Any]]:
    """The newest transforms of every tenant as shown (with their tenant), for the console:
    their running shards read in one grouped statement, not one per transform."""
    found = list(
        session.scalars(
            select(Transform)
            .order_by(Transform.id.desc())
            .limit(limit)
            .execution_options(populate_existing=True)
        )
    )
    if not found:
        return []
    rows = session.execute(
        select(
            _jobs.c.transform_id,
            func.count(),
            func.coalesce(func.sum(_jobs.c.samples_done), 0),
            func.min(_jobs.c.started_at),
        )
        .where(
            _jobs.c.transform_id.in_([t.id for t in found]),
            _jobs.c.status == JobStatus.RUNNING.value,
        )
        .group_by(_jobs.c.transform_id)
    ).all()
    by_id = {
        row[0]: Running(shards=int(row[1]), records_done=int(row[2]), started_at=row[3])
        for row in rows
    }
    return [
        {**transform_out(t, running=by_id.get(t.id), now=now), "tenant": t.tenant} for t in found
    ]


# ─── Cancel and retry ─────────────────────────────────────────────────────────────────────────────


def cancel(*, session: Session, transform_id: str, tenant: str | None = None) -> Transform:
    """Cancel an unfinished transform: its queued shards never start; its running ones lose
    their lease (their late results match nothing) and their workers stop at a batch boundary.
    Its shards done keep their parts. Canceling twice is not an error; one that ended is 409."""
    get(session=session, transform_id=transform_id, tenant=tenant)
    now = clock.now(session)
    # Its shards first, then its row: the order a worker's completing transaction takes them
    # (a shard's row, then its transform's in `shard_finished`), so the two never deadlock. An
    # ended transform has no unfinished shard: this changes nothing then. Locked in id order,
    # as the take-back locks jobs, before the UPDATE (which takes them in no set order).
    unfinished = (_jobs.c.transform_id == transform_id, _jobs.c.status.in_(_UNFINISHED))
    session.execute(select(_jobs.c.id).where(*unfinished).order_by(_jobs.c.id).with_for_update())
    session.execute(
        update(_jobs)
        .where(*unfinished)
        .values(
            status=JobStatus.CANCELED.value,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    ended = session.execute(
        update(_transforms)
        .where(_transforms.c.id == transform_id, _transforms.c.status.in_(_OPEN))
        .values(status=TransformStatus.CANCELED.value, finished_at=now)
        .returning(_transforms.c.webhook_events)
    ).one_or_none()
    if ended is None:
        transform = get(session=session, transform_id=transform_id, tenant=tenant)
        if transform.status == TransformStatus.CANCELED.value:
            return transform
        raise Conflict(f"transform {transform_id!r} already finished as {transform.status}")
    if webhooks.wants(ended.webhook_events, webhooks.Event.COMPLETED):
        webhooks.record_transform(session=session, transform_id=transform_id, at=now)
    return get(session=session, transform_id=transform_id, tenant=tenant)


def retryable(*, session: Session, transform_id: str, tenant: str | None = None) -> int:
    """How many of a transform's shards `retry` would queue again (its failed and canceled)."""
    get(session=session, transform_id=transform_id, tenant=tenant)
    return int(
        session.scalar(
            select(func.count()).where(
                _jobs.c.transform_id == transform_id, _jobs.c.status.in_(_RETRYABLE)
            )
        )
        or 0
    )


def retry(
    *,
    session: Session,
    transform_id: str,
    tenant: str | None = None,
    input_ttl_s: float | None = None,
) -> tuple[Transform, list[str]]:
    """Queue a transform's failed and canceled shards again (db.jobs `retry` each, under its id:
    a late result of an earlier run matches nothing); its succeeded shards are not run again.
    Returns the transform and the shards queued, to publish once the transaction commits. A
    transform with none to retry (running, or succeeded) is 409; a shard whose inputs were
    purged (TFFLEET_INPUT_TTL_S) is 410, and nothing is retried."""
    transform = get(session=session, transform_id=transform_id, tenant=tenant)
    ids = list(
        session.scalars(
            select(_jobs.c.id)
            .where(_jobs.c.transform_id == transform_id, _jobs.c.status.in_(_RETRYABLE))
            .order_by(_jobs.c.shard)
        )
    )
    if transform.status in _OPEN or not ids:
        raise Conflict(
            f"transform {transform_id!r} is {transform.status}: only a failed or canceled "
            "transform's failed or canceled shards can be retried"
        )
    # Counted failed, each of them (a canceled transform's canceled shards were not), so that
    # each `retry` below uncounts one (db.transforms.shard_retried) and reopens the transform.
    session.execute(
        update(_transforms).where(_transforms.c.id == transform_id).values(shards_failed=len(ids))
    )
    for job_id in ids:  # each one's `retry` uncounts it (db.transforms.shard_retried)
        jobs.retry(session=session, job_id=job_id, input_ttl_s=input_ttl_s)
    return get(session=session, transform_id=transform_id, tenant=tenant), ids
