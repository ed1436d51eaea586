"""A transform's shards, the database's side: the shard spec a shard job holds in place of packed
tensors, and the hooks that count a shard's end into its transform (DESIGN §14).

A shard is an ordinary job (`jobs.transform_id`, `jobs.shard`) whose inputs blob is a shard spec
(`pack_shard_spec`): `b"TFS1"` and JSON naming which records of which file it reads and where its
part goes. Its end is counted into its transform in the transaction that ends it:

- `shard_finished`: the worker's completing transaction (fenced by the lease its caller holds);
  adds the shard's record counts, `shards_done + 1`;
- `shard_failed`: every path that ends a job without success for good (db/jobs/leases.py `fail`
  and the take-back's `worker_lost`, db/jobs/control.py `cancel` and `cancel_overdue`, the claim's
  deadline); `shards_failed + 1` each;
- `shard_retried`: a failed shard queued again (db/jobs/control.py `retry`); `shards_failed - 1`.

The transform's row is locked first (as db/parts.py `settle` locks a split job's), so of two
transactions ending its last two shards the second sees the first's counts, and exactly one
ends the transform: `succeeded` when every shard succeeded (bad records are counted, not
failures), `failed` when some failed for good. Its end records its webhook's event.

Imports no module of db/jobs/ (they import this one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Table, case, func, select, update
from sqlalchemy.orm import Session

from db import clock, webhooks
from db.models import Job, JobStatus, Transform, TransformStatus

_jobs: Table = Job.__table__  # type: ignore[assignment]
_transforms: Table = Transform.__table__  # type: ignore[assignment]

SHARD_MAGIC = b"TFS1"
_OPEN = (TransformStatus.QUEUED.value, TransformStatus.RUNNING.value)

Buffer = bytes | bytearray | memoryview


# ─── The shard spec ───────────────────────────────────────────────────────────────────────────────


def pack_shard_spec(spec: Mapping[str, Any]) -> bytes:
    """A shard job's inputs blob: `b"TFS1"` then the spec as JSON ({"transform", "shard", "file":
    {"uri", "format", "info"}, "start", "stop", "columns", "key", "output": {"uri", "format"},
    "part_uri", "errors_uri", "batch_records"})."""
    return SHARD_MAGIC + orjson.dumps(dict(spec))


def shard_spec(blob: Buffer | None) -> dict[str, Any] | None:
    """The shard spec a job's inputs blob holds, or None for packed tensors (any other job)."""
    if blob is None or bytes(blob[: len(SHARD_MAGIC)]) != SHARD_MAGIC:
        return None
    spec: dict[str, Any] = orjson.loads(bytes(blob[len(SHARD_MAGIC) :]))
    return spec


def is_shard_spec(blob: Buffer | None) -> bool:
    """Whether a job's inputs blob is a shard spec, without parsing it."""
    return blob is not None and bytes(blob[: len(SHARD_MAGIC)]) == SHARD_MAGIC


# ─── A shard's end ────────────────────────────────────────────────────────────────────────────────


def shard_finished(
    session: Session, *, job_id: str, transform_id: str, succeeded: int, failed: int
) -> bool:
    """Count a succeeded shard into its transform: its records that gave outputs (`succeeded`)
    and those that went to its errors file (`failed`), one more shard done; the transform ends
    when it was the last. Call it in the transaction whose fenced `complete` wrote the shard (and
    only when that write matched: a stale worker's counts must not count twice).

    Returns whether the transform ended here. Counts nothing unless the job is a shard of
    `transform_id` that is `succeeded` as of this transaction: a transform canceled meanwhile
    canceled its shards, whose late results then match no lease and count nothing."""
    written = session.scalar(
        select(_jobs.c.id).where(
            _jobs.c.id == job_id,
            _jobs.c.transform_id == transform_id,
            _jobs.c.status == JobStatus.SUCCEEDED.value,
        )
    )
    row = _lock(session, transform_id) if written else None
    if row is None:  # not a shard of it, or its `complete` did not match: nothing to count
        return False
    now = clock.now(session)
    values: dict[str, Any] = {
        "records_succeeded": _transforms.c.records_succeeded + int(succeeded),
        "records_failed": _transforms.c.records_failed + int(failed),
        "shards_done": _transforms.c.shards_done + 1,
    }
    # Its records with outputs, on its row: 0 says it wrote no part (no good record), which
    # the transform's list of files leaves out (db.transform_control.running).
    session.execute(update(_jobs).where(_jobs.c.id == job_id).values(samples_done=int(succeeded)))
    if row.status == TransformStatus.QUEUED.value:
        values |= {
            "status": TransformStatus.RUNNING.value,
            "started_at": _started(session, row, now),
        }
    session.execute(update(_transforms).where(_transforms.c.id == transform_id).values(**values))
    return _end_if_done(session, transform_id, now)


def shard_failed(session: Session, job_ids: Iterable[str]) -> list[str]:
    """Count shards among `job_ids` (any jobs: those that are no shard are ignored) that this
    transaction ended without success for good: failed (an error, `worker_lost`, a timeout) or
    canceled one by one. Returns the transforms that ended here (`failed`).

    One SELECT by primary key when none is a shard: every path that fails jobs may call it."""
    ids = sorted(set(job_ids))
    if not ids:
        return []
    shards = session.execute(
        select(_jobs.c.transform_id, func.count())
        .where(_jobs.c.id.in_(ids), _jobs.c.transform_id.is_not(None))
        .group_by(_jobs.c.transform_id)
    ).all()
    ended = []
    now = clock.now(session) if shards else None
    for transform_id, count in sorted(shards):
        row = _lock(session, transform_id)
        if row is None or row.status not in _OPEN:
            continue  # canceled as a whole: its shards' ends change nothing
        session.execute(
            update(_transforms)
            .where(_transforms.c.id == transform_id)
            .values(shards_failed=_transforms.c.shards_failed + int(count))
        )
        assert now is not None
        if _end_if_done(session, transform_id, now):
            ended.append(transform_id)
    return ended


def shard_retried(session: Session, job_ids: Iterable[str]) -> None:
    """Shards among `job_ids` queued again after they failed or were canceled (db/jobs/control.py
    `retry`): no longer counted failed, and their transform, if it ended `failed`, runs again
    (`queued`, or `running` where some shard is done; no finish time)."""
    ids = sorted(set(job_ids))
    if not ids:
        return
    shards = session.execute(
        select(_jobs.c.transform_id, func.count())
        .where(_jobs.c.id.in_(ids), _jobs.c.transform_id.is_not(None))
        .group_by(_jobs.c.transform_id)
    ).all()
    for transform_id, count in sorted(shards):
        row = _lock(session, transform_id)
        if row is None:
            continue
        reopened = TransformStatus.RUNNING if row.shards_done else TransformStatus.QUEUED
        session.execute(
            update(_transforms)
            .where(_transforms.c.id == transform_id)
            .values(
                shards_failed=_transforms.c.shards_failed - int(count),
                status=reopened.value,
                finished_at=None,
            )
        )


def _lock(session: Session, transform_id: str) -> Any:
    """The transform's row, locked for this transaction (SQLite: one writer at a time)."""
    return session.execute(
        select(
            _transforms.c.id,
            _transforms.c.status,
            _transforms.c.shards_done,
            _transforms.c.started_at,
        )
        .where(_transforms.c.id == transform_id)
        .with_for_update()
    ).one_or_none()


def _started(session: Session, row: Any, now: datetime) -> datetime:
    """When the transform started, as its first shard's end records it: its first shard's
    claim (what the view shows while it runs), never later than `now`, the time its end (and
    perhaps the transform's `finished_at`) is written with; a clock read of its own here would
    come after `now` and make a one-shard transform start after it finished."""
    if row.started_at is not None:
        return min(row.started_at, now)
    first = session.scalar(
        select(func.min(_jobs.c.started_at)).where(_jobs.c.transform_id == row.id)
    )
    return now if first is None else min(first, now)


def _end_if_done(session: Session, transform_id: str, now: datetime) -> bool:
    """End an open transform all of whose shards ended: `succeeded` or `failed`, at `now`."""
    ended = session.execute(
        update(_transforms)
        .where(
            _transforms.c.id == transform_id,
            _transforms.c.status.in_(_OPEN),
            _transforms.c.shards_done + _transforms.c.shards_failed >= _transforms.c.shards_total,
        )
        .values(
            status=case(
                (_transforms.c.shards_failed > 0, TransformStatus.FAILED.value),
                else_=TransformStatus.SUCCEEDED.value,
            ),
            finished_at=now,
            started_at=func.coalesce(_transforms.c.started_at, now),
        )
        .returning(_transforms.c.webhook_events)
    ).one_or_none()
    if ended is None:
        return False
    if webhooks.wants(ended.webhook_events, webhooks.Event.COMPLETED):
        webhooks.record_transform(session=session, transform_id=transform_id, at=now)
    return True
