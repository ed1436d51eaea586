"""What jobs cost (DESIGN §15): a job's `usage` as its JSON shows it, the `usage_records` rows
written as jobs end, and the sums `GET /v1/usage`, `tffleet usage` and the console read.

A job's device seconds are its share, by samples, of each forward pass it took part in
(worker/pipeline.py); the worker adds them to its row in the UPDATE that ends it (db/jobs/
leases.py) and appends one `usage_records` row per tenant of the batch (`record`), in the same
transaction. A record's `device_s` is everything its batch's forward passes took, so the rows
of a period add up to the devices' busy seconds (`tffleet_device_busy_seconds_total`). A split
job's parts count their samples and device seconds as they run (`jobs` 0: they are not the
client's jobs); the job counts once, with its queue and run time, when it ends (db/parts.py).

Rows are by hour (`bucket`: the start of the hour the batch ended in); readers sum them. The
sweeper folds the rows of each past hour, tenant and model into one (`fold`), so the table keeps
a row per hour, tenant and model, not one per batch. `GET /v1/usage`'s `from` and `to` are taken
to the hour (`from` down, `to` up).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Table, case, delete, func, insert, select
from sqlalchemy.orm import Session

from db.models import UsageRecord

_usage: Table = UsageRecord.__table__  # type: ignore[assignment]

HOUR = timedelta(hours=1)


def hour(at: datetime) -> datetime:
    """The start of the hour `at` falls in: a record's bucket."""
    return at.replace(minute=0, second=0, microsecond=0)


def seconds(start: datetime | None, end: datetime | None) -> float:
    """From `start` to `end` in seconds, never below 0; 0 where either is unknown."""
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds())


def usage_out(
    *,
    created_at: datetime | None,
    started_at: datetime | None,
    finished_at: datetime | None,
    device_s: float | None,
    samples: int | None,
) -> dict[str, Any]:
    """An ended job's `usage`: queued from its creation to its start (to its end, if it never
    started), running from its start to its end, its device seconds (0 if it never ran) and
    samples."""
    started = started_at if started_at is not None else finished_at
    return {
        "queue_s": round(seconds(created_at, started), 6),
        "run_s": round(seconds(started_at, finished_at), 6),
        "device_s": round(device_s or 0.0, 6),
        "samples": int(samples or 0),
    }


# ─── Writing ──────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Tally:
    """One (tenant, model)'s part of a batch, as `record` writes it."""

    jobs: int = 0
    samples: int = 0
    device_s: float = 0.0
    queue_s: float = 0.0
    run_s: float = 0.0


@dataclass
class Batch:
    """What one batch (or one split job's end) cost, by tenant, for one model: `add` each job."""

    model: str
    by_tenant: dict[str, Tally] = field(default_factory=dict)

    def add(
        self,
        tenant: str | None,
        *,
        ended: bool,
        samples: int = 0,
        device_s: float = 0.0,
        queue_s: float = 0.0,
        run_s: float = 0.0,
    ) -> None:
        """A job of the batch: `ended` counts it as one job (a part, or a job put back to run
        again, counts its samples and device seconds only)."""
        tally = self.by_tenant.setdefault(tenant or "", Tally())
        tally.jobs += int(ended)
        tally.samples += samples
        tally.device_s += device_s
        tally.queue_s += queue_s
        tally.run_s += run_s


def record(session: Session, batch: Batch, *, at: datetime) -> None:
    """Append the batch's rows (one per tenant, in one statement), in the hour of `at`."""
    rows = [
        {
            "bucket": hour(at),
            "tenant": tenant,
            "model": batch.model,
            "jobs": tally.jobs,
            "samples": tally.samples,
            "device_s": tally.device_s,
            "queue_s": tally.queue_s,
            "run_s": tally.run_s,
        }
        for tenant, tally in sorted(batch.by_tenant.items())
        if tally.jobs or tally.samples or tally.device_s
    ]
    if rows:
        session.execute(insert(_usage), rows)


def fold(
    *, session: Session, before: datetime, span: timedelta = timedelta(days=2), limit: int = 100
) -> int:
    """Fold the rows of each (hour, tenant, model) of the hours from `span` before `before` to
    `before` (each down to its hour) into one, at most `limit` groups a call: a row per batch
    is a row per hour then, and the sums stay what they were. `before` should be an hour or
    more ago, so that no batch still ends in those hours; a row added meanwhile (an id above
    those read) is left for the next call. Returns how many rows went."""
    groups = session.execute(
        select(
            _usage.c.bucket,
            _usage.c.tenant,
            _usage.c.model,
            func.max(_usage.c.id),
            func.count(),
            *(func.sum(_usage.c[name]) for name in _SUMS),
        )
        .where(_usage.c.bucket >= hour(before - span), _usage.c.bucket < hour(before))
        .group_by(_usage.c.bucket, _usage.c.tenant, _usage.c.model)
        .having(func.count() > 1)
        .limit(limit)
    ).all()
    removed = 0
    for bucket, tenant, model, last, count, *sums in groups:
        session.execute(
            delete(_usage).where(
                _usage.c.bucket == bucket,
                _usage.c.tenant == tenant,
                _usage.c.model == model,
                _usage.c.id <= last,
            )
        )
        session.execute(
            insert(_usage),
            [{"bucket": bucket, "tenant": tenant, "model": model}
             | {name: value or 0 for name, value in zip(_SUMS, sums, strict=True)}],
        )  # fmt: skip
        removed += int(count) - 1
    return removed


# ─── Reading ──────────────────────────────────────────────────────────────────────────────────────


class GroupBy(StrEnum):
    TENANT = "tenant"
    MODEL = "model"
    DAY = "day"


_SUMS = ("jobs", "samples", "device_s", "queue_s", "run_s")


def summarize(
    *,
    session: Session,
    start: datetime,
    end: datetime,
    group_by: GroupBy,
    tenant: str | None = None,
) -> list[dict[str, Any]]:
    """The records of the hours from `start` (down to its hour) to `end` (up to its hour),
    of `tenant` (None: every tenant), summed per tenant, model or day (UTC), in that order:
    `[{"tenant"|"model"|"day": key, "jobs", "samples", "device_s", "queue_s", "run_s"}]`."""
    upper = hour(end) if end == hour(end) else hour(end) + HOUR
    # A day is summed from its hours here: no date function is the same on SQLite and
    # PostgreSQL, and a day holds at most 24 groups per key.
    key = _usage.c.bucket if group_by is GroupBy.DAY else _usage.c[group_by.value]
    query = (
        select(key, *(func.sum(_usage.c[name]) for name in _SUMS))
        .where(_usage.c.bucket >= hour(start), _usage.c.bucket < upper)
        .group_by(key)
    )
    if tenant is not None:
        query = query.where(_usage.c.tenant == tenant)
    groups: dict[str, list[float]] = {}
    for row in session.execute(query):
        name = row[0].date().isoformat() if group_by is GroupBy.DAY else str(row[0])
        sums = groups.setdefault(name, [0.0] * len(_SUMS))
        for i, value in enumerate(row[1:]):
            sums[i] += float(value or 0)
    return [_group(group_by.value, name, sums) for name, sums in sorted(groups.items())]


def total(groups: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The groups' sums added up."""
    sums = [0.0] * len(_SUMS)
    for group in groups:
        for i, name in enumerate(_SUMS):
            sums[i] += group[name]
    return {name: value for name, value in _group("", "", sums).items() if name}


def _group(kind: str, name: str, sums: list[float]) -> dict[str, Any]:
    jobs, samples, device_s, queue_s, run_s = sums
    return {
        kind: name,
        "jobs": int(jobs),
        "samples": int(samples),
        "device_s": round(device_s, 6),
        "queue_s": round(queue_s, 6),
        "run_s": round(run_s, 6),
    }


def device_by_tenant(
    *, session: Session, now: datetime, span: timedelta = HOUR
) -> dict[str, float]:
    """Each tenant's device seconds over the last `span` (the console's tenants): the hours
    it covers, the first counted for the part of it within the span (records are by hour)."""
    since = now - span
    first = hour(since)
    inside = 1.0 - seconds(first, since) / HOUR.total_seconds()
    weighted = case((_usage.c.bucket == first, _usage.c.device_s * inside), else_=_usage.c.device_s)
    rows = session.execute(
        select(_usage.c.tenant, func.sum(weighted))
        .where(_usage.c.bucket >= first)
        .group_by(_usage.c.tenant)
    )
    return {tenant: round(float(value or 0), 3) for tenant, value in rows}
