"""A job split into parts that every child serving its model may run at once.

A job of more samples than one batch holds would otherwise run as chunks, one after another, in
the child that claimed it, while the others idle. That child splits it instead (`split`): each
part is a job row of its own (`parent_id`, `part_offset`), queued, so the claim, the leases, the
heartbeat, the sweeper and the "claimed before runs alone" rule treat a part as any job. The
job itself stays `running`, without a lease, while its parts run:

    job (running, parts = n) ── its parts: queued ─▶ running ─▶ succeeded / failed
       │
       └── settle (in the transaction that ends a part, or the sweeper's) ─▶
             every part succeeded: the job's outputs, joined in part order, written once
             a part failed:        the job fails with that part's error
             the job ended else (canceled): its parts are deleted, a late result is dropped

Parts never show in listings or tenant quotas; a job's `samples_done` counts its parts'
samples that succeeded, for progress. Once the job ends, its parts are deleted.

An input the job holds in the object store (a `Reference`) is not copied: each part references
the same object, at its own rows (`_slice`). The object stays while the job keeps its inputs,
so while its parts run. A part's outputs stay inline in its row, for `settle` to join; a joined
output over the inline limit goes to the store (`Spill`) under the job's own outputs/, and the
job's row holds its reference, never the bytes. `split` marks the job as owning objects
(`stored_bytes` at least 0) before any part runs, so an object written by a join whose
transaction then failed is still under a prefix its deletion removes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Table, delete, func, select, update
from sqlalchemy.orm import Session

from db import cache, clock, usage, webhooks
from db.jobs import Lease
from db.models import Job, JobErrorCode, JobInput, JobStatus
from db.models.jobs import NO_DEADLINE
from tffleet import tensors
from tffleet.objectstore import ObjectStore, keys
from tffleet.tensors import Reference

_jobs: Table = Job.__table__  # type: ignore[assignment]
_inputs: Table = JobInput.__table__  # type: ignore[assignment]


def part_ids(parent_id: str, count: int) -> list[str]:
    """UUIDv7s of the parent's millisecond, growing in part order: the parts queue where their
    job did (ids order age), and run first to last."""
    ms = uuid.UUID(parent_id).int >> 80
    start = int.from_bytes(os.urandom(10), "big") >> 7  # 73 bits: room to count up
    ids = []
    for index in range(count):
        tail = start + index
        value = ms << 80 | 0x7 << 76 | (tail >> 62) << 64 | 0x2 << 62 | tail & ((1 << 62) - 1)
        ids.append(str(uuid.UUID(int=value)))
    return ids


def split(
    *, session: Session, lease: Lease, model: str, version: int, part_samples: int
) -> list[str]:
    """Split a claimed job into queued parts of `part_samples` samples (the last may be
    smaller); returns their ids, in order. The job stays `running`, its lease let go: its parts
    now hold it. Empty if the lease no longer holds (the job was canceled, or taken back)."""
    arrays = tensors.unpack(lease.inputs, inline_only=True)
    references = tensors.references(lease.inputs)
    starts = list(range(0, lease.samples, part_samples))
    held = session.execute(
        update(_jobs)
        .where(
            _jobs.c.id == lease.job_id,
            _jobs.c.status == JobStatus.RUNNING.value,
            _jobs.c.lease_owner == lease.owner,
            _jobs.c.attempts == lease.attempt,
        )
        .values(
            parts=len(starts),
            samples_done=0,
            lease_owner=None,
            lease_expires_at=None,
            # Its join may write outputs to the store (`settle`): marked before any part runs.
            stored_bytes=func.coalesce(_jobs.c.stored_bytes, 0),
        )
        .returning(_jobs.c.tenant, _jobs.c.ttl_s)
    ).one_or_none()
    if held is None:
        return []
    ids = part_ids(lease.job_id, len(starts))
    rows = []
    for part, start in zip(ids, starts, strict=True):
        rows.append(
            {
                "id": part,
                "parent_id": lease.job_id,
                "part_offset": start,
                "tenant": held.tenant,
                "model": model,
                "version": version,
                "status": JobStatus.QUEUED.value,
                "priority": lease.priority,
                "samples": min(part_samples, lease.samples - start),
                "attempts": 0,
                "created_at": lease.created_at,
                # The job's place among its tenant's jobs of its priority: by its deadline.
                "pick_deadline": lease.deadline_at or NO_DEADLINE,
            }
        )
    session.execute(_jobs.insert(), rows)
    session.execute(
        _inputs.insert(),
        [
            {
                "job_id": part,
                "data": tensors.pack(
                    {k: v[s : s + part_samples] for k, v in arrays.items()},
                    {k: _slice(ref, s, part_samples) for k, ref in references.items()},
                ),
            }
            for part, s in zip(ids, starts, strict=True)
        ],
    )
    # The job keeps its own inputs too, a copy while its parts run: a client may retry it once
    # it failed or was canceled, and it then runs whole (db.jobs.retry).
    return ids


def _slice(ref: Reference, start: int, rows: int) -> Reference:
    """Rows `start` to `start + rows` of a referenced tensor (fewer at its end): the same object,
    further in (an .npy's data is C-order, so a run of rows is a run of bytes)."""
    row_bytes = ref.nbytes // ref.shape[0] if ref.shape[0] else 0
    rows = max(0, min(rows, ref.shape[0] - start))
    return Reference(
        key=ref.key,
        dtype=ref.dtype,
        shape=(rows, *ref.shape[1:]),
        offset=ref.offset + start * row_bytes,
        nbytes=rows * row_bytes,
    )


@dataclass(frozen=True)
class Spill:
    """Where a joined output over `inline_max_bytes` goes: the object store (the worker's)."""

    store: ObjectStore
    inline_max_bytes: int


def settle(*, session: Session, parent_ids: Iterable[str], spill: Spill | None = None) -> list[str]:
    """After parts ended: record each job's progress, and end a job whose parts all succeeded
    (its outputs joined in part order) or one of whose parts failed. Returns the jobs that ended.

    Each job's row is locked first, so of two transactions that end its last two parts, the
    second sees the first's and writes the outputs (SQLite runs one writer at a time). With
    `spill`, a joined output over its limit is written to the store, under the job's key for it,
    before the row references it: a transaction that fails after the write leaves an object the
    next join writes again, byte for byte, and `stored_bytes` grows only when the row does.
    Raises `StoreUnavailable` (the transaction rolls back: the parts run again) when the store
    does not answer."""
    ended = []
    for parent_id in sorted(set(parent_ids)):
        parent = session.execute(
            select(
                _jobs.c.status,
                _jobs.c.parts,
                _jobs.c.samples,
                _jobs.c.cache_key,
                _jobs.c.webhook_events,
                _jobs.c.tenant,
                _jobs.c.model,
                _jobs.c.created_at,
                _jobs.c.started_at,
            )
            .where(_jobs.c.id == parent_id)
            .with_for_update()
        ).one_or_none()
        if parent is None:
            continue
        if parent.status != JobStatus.RUNNING.value or parent.parts is None:
            _discard(session, parent_id)  # it ended otherwise (canceled): drop what is left
            continue
        parts = session.execute(
            select(
                _jobs.c.id,
                _jobs.c.status,
                _jobs.c.samples,
                _jobs.c.part_offset,
                _jobs.c.error_code,
                _jobs.c.error_message,
                _jobs.c.device_s,
            )
            .where(_jobs.c.parent_id == parent_id)
            .order_by(_jobs.c.part_offset)
        ).all()
        now = clock.now(session)
        # Its parts' forward passes (their rows go with its end): what the job cost.
        device_s = sum(p.device_s or 0.0 for p in parts)
        failed = next((p for p in parts if p.status == JobStatus.FAILED.value), None)
        if failed is not None:
            end = failed.part_offset + failed.samples
            session.execute(
                update(_jobs)
                .where(_jobs.c.id == parent_id)
                .values(
                    status=JobStatus.FAILED.value,
                    error_code=failed.error_code or JobErrorCode.MODEL_ERROR.value,
                    error_message=f"samples {failed.part_offset} to {end - 1}: "
                    f"{failed.error_message or ''}",
                    finished_at=now,
                    device_s=device_s,
                )
            )
            _discard(session, parent_id)
            _record_usage(session, parent, now)
            ended.append(parent_id)
            _record_end(session, parent_id, parent.webhook_events, now)
            continue
        done = [p for p in parts if p.status == JobStatus.SUCCEEDED.value]
        values: dict[str, Any] = {"samples_done": sum(p.samples for p in done)}
        if len(done) == parent.parts:
            joined, stored = _join(session, [p.id for p in done], parent_id, parent.tenant, spill)
            values |= {
                "status": JobStatus.SUCCEEDED.value,
                "outputs": joined,
                "finished_at": now,
                "device_s": device_s,
            }
            if stored:
                values["stored_bytes"] = func.coalesce(_jobs.c.stored_bytes, 0) + stored
            if parent.cache_key and not stored:  # an output by reference is not cached
                cache.remember(session=session, entries=[(parent.cache_key, joined)], now=now)
            ended.append(parent_id)
        session.execute(update(_jobs).where(_jobs.c.id == parent_id).values(**values))
        if parent_id in ended:
            _discard(session, parent_id)
            _record_usage(session, parent, now)
            _record_end(session, parent_id, parent.webhook_events, now)
    return ended


def _record_usage(session: Session, parent: Any, now: Any) -> None:
    """The split job counts once in usage (db/usage.py) as it ends, with its time queued and
    running: its parts counted their samples and device seconds as they ran."""
    cost = usage.Batch(parent.model)
    cost.add(
        parent.tenant,
        ended=True,
        queue_s=usage.seconds(parent.created_at, parent.started_at),
        run_s=usage.seconds(parent.started_at, now),
    )
    usage.record(session, cost, at=now)


def _record_end(session: Session, job_id: str, webhook_events: int | None, now: Any) -> None:
    if webhooks.wants(webhook_events, webhooks.Event.COMPLETED):
        webhooks.record(session=session, event=webhooks.Event.COMPLETED, job_ids=[job_id], at=now)


def stranded(*, session: Session, limit: int = 100) -> list[str]:
    """Split jobs to settle that no part's transaction settled: a part failed `worker_lost` or
    `timeout` (the sweeper and the worker's main process end those), or the job was canceled
    while parts remained. The sweeper settles them."""
    parent = _jobs.alias("parent")
    query = (
        select(_jobs.c.parent_id)
        .join(parent, parent.c.id == _jobs.c.parent_id)
        .where(
            # Parts only, read by the index from the first: not every job's null parent_id.
            _jobs.c.parent_id.is_not(None),
            (_jobs.c.status == JobStatus.FAILED.value)
            | (parent.c.status != JobStatus.RUNNING.value),
        )
        .distinct()
        .limit(limit)
    )
    return list(session.scalars(query))


def _join(
    session: Session,
    part_ids: Sequence[str],
    job_id: str,
    tenant: str | None,
    spill: Spill | None,
) -> tuple[bytes, int]:
    """The parts' outputs joined in part order, packed: those over the spill's limit as
    references to objects written under the job's outputs/. Returns the blob and the bytes
    written to the store."""
    outputs = dict(
        session.execute(select(_jobs.c.id, _jobs.c.outputs).where(_jobs.c.id.in_(part_ids))).all()
    )
    parts = [tensors.unpack(outputs[part]) for part in part_ids]
    joined = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    if spill is None or tenant is None:
        return tensors.pack(joined), 0
    references: dict[str, Reference] = {}
    for name, array in joined.items():
        if tensors.is_string(array) or array.nbytes <= spill.inline_max_bytes:
            continue
        references[name] = _write(spill.store, keys.output_key(tenant, job_id, name), array)
    inline = {name: array for name, array in joined.items() if name not in references}
    stored = sum(ref.offset + ref.nbytes for ref in references.values())
    return tensors.pack(inline, references), stored


def _write(store: ObjectStore, key: str, array: np.ndarray) -> Reference:
    """One output as a whole .npy object, as the worker writes a job's own."""
    data, reference = tensors.npy_object(key, array)
    store.put(key, data)
    return reference


def _discard(session: Session, parent_id: str) -> None:
    """Delete a job's parts (their inputs go with them); a late result of one finds no row."""
    session.execute(delete(_jobs).where(_jobs.c.parent_id == parent_id))
