"""A transform's JSON form, as `GET /v1/transforms/{id}` shows it: the API's answers and the body
of its webhook (worker/webhooks.py) are built here, so the two never differ (as db/views.py does
for a job)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from db.models import Transform, TransformStatus
from db.usage import usage_out
from db.views import iso_utc

# A part's file name by the output's format (the worker writes `<output>/part-<shard:05d>.<ext>`).
EXTENSIONS = {"parquet": "parquet", "jsonl": "jsonl", "npy": "npy"}


def part_uri(output_uri: str, shard: int, format: str) -> str:
    """Where a shard's output part goes: written whole or not at all, by its worker."""
    return f"{output_uri.rstrip('/')}/part-{shard:05d}.{EXTENSIONS[format]}"


def errors_uri(output_uri: str) -> str:
    """The folder of a transform's errors files, one per shard that had bad records."""
    return f"{output_uri.rstrip('/')}/errors/"


def shard_errors_uri(output_uri: str, shard: int) -> str:
    return f"{errors_uri(output_uri)}part-{shard:05d}.jsonl"


@dataclass(frozen=True)
class Running:
    """What a transform's row does not hold: its running shards, the records they have done so
    far (their heartbeats' `samples_done`), and the output parts written (its succeeded shards)."""

    shards: int = 0
    records_done: int = 0
    parts: tuple[int, ...] = ()
    started_at: datetime | None = None  # its first shard's start (the row's is set at an end)
    # Its shards' device seconds summed (db/usage.py): read where its `usage` is shown.
    device_s: float | None = None


def transform_out(
    transform: Transform | Any, *, running: Running | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """The JSON form of a transform (an ORM object or a plain row), with its progress (records
    ended, and those its running shards did, over all) and an ETA from its pace since it
    started (null until a record is done, and once it ended)."""
    running = running or Running()
    records = int(transform.records)
    ended = int(transform.records_succeeded) + int(transform.records_failed)
    finished = TransformStatus(transform.status).finished
    done = ended + (0 if finished else running.records_done)
    progress = 1.0 if records == 0 else min(done / records, 1.0)
    if transform.status == TransformStatus.SUCCEEDED.value:
        progress = 1.0
    status = transform.status
    if status == TransformStatus.QUEUED.value and running.shards:
        status = TransformStatus.RUNNING.value  # stored at its first shard's end; shown now
    started_at = transform.started_at or running.started_at
    output = transform.spec.get("output", {})
    format = output.get("format", "parquet")
    return {
        "id": transform.id,
        "status": status,
        "model": transform.model,
        "version": transform.version,
        "priority": transform.priority,
        "counts": {
            "records": records,
            "succeeded": int(transform.records_succeeded),
            "failed": int(transform.records_failed),
        },
        "shards": {
            "total": transform.shards_total,
            "done": transform.shards_done,
            "failed": transform.shards_failed,
            "running": 0 if finished else running.shards,
        },
        "progress": round(progress, 6),
        "eta_s": None if finished else _eta_s(started_at, done, records, now),
        "output": {
            "uri": transform.output_uri,
            "format": format,
            "files": [part_uri(transform.output_uri, shard, format) for shard in running.parts],
        },
        "errors_uri": transform.errors_uri,
        "created_at": iso_utc(transform.created_at),
        "started_at": iso_utc(started_at),
        "finished_at": iso_utc(transform.finished_at),
        "usage": _usage(transform, started_at, running) if finished else None,
    }


def _usage(transform: Transform | Any, started_at: datetime | None, running: Running) -> Any:
    """A transform's `usage`, as a job's: its shards summed (None where they were not read)."""
    if running.device_s is None:
        return None
    return usage_out(
        created_at=transform.created_at,
        started_at=started_at,
        finished_at=transform.finished_at,
        device_s=running.device_s,
        samples=int(transform.records),
    )


def _eta_s(started: datetime | None, done: int, records: int, now: datetime | None) -> float | None:
    """Seconds left at the pace since its first shard started; None before there is a pace."""
    if now is None or started is None or done <= 0:
        return None
    elapsed = (now - started).total_seconds()
    if elapsed <= 0:
        return None
    return round(max(records - done, 0) / (done / elapsed), 3)
