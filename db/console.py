"""What the operator's console shows (api/routes/console.py), read in a few indexed queries.

    the queue      queued and running jobs per model version and tenant, the oldest queued
    the minutes    jobs ended per minute over the last `minutes`, their latency (created to
                   finished) at p50 and p95 from a bounded sample of each minute
    failures       the latest failed jobs with their error codes

Every read here is bounded: the console polls it, and it must stay cheap beside the traffic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from db.models import Job, JobStatus

_UNFINISHED = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
# Latencies sampled per minute: enough for a p95 that means something, bounded per poll.
LATENCY_SAMPLE = 200


@dataclass(frozen=True)
class Unfinished:
    """Queued and running jobs of one model version (and tenant), and the oldest queued one."""

    model: str
    version: int
    tenant: str
    queued: int
    running: int
    oldest_queued_at: datetime | None


def unfinished(*, session: Session) -> list[Unfinished]:
    """Per model version and tenant: one scan of the unfinished rows (the backlog itself)."""
    queued = Job.status == JobStatus.QUEUED.value
    rows = session.execute(
        select(
            Job.model,
            Job.version,
            Job.tenant,
            func.sum(case((queued, 1), else_=0)),
            func.sum(case((queued, 0), else_=1)),
            func.min(case((queued, Job.created_at), else_=None)),
        )
        .where(Job.status.in_(_UNFINISHED), Job.parent_id.is_(None))
        .group_by(Job.model, Job.version, Job.tenant)
    ).all()
    return [
        Unfinished(model, version, tenant, int(q or 0), int(r or 0), oldest)
        for model, version, tenant, q, r, oldest in rows
    ]


@dataclass(frozen=True)
class Minute:
    start: datetime
    ended: int  # jobs that ended in it (succeeded, failed or canceled)
    failed: int
    canceled: int
    p50_ms: float | None  # latency, created to finished, of a sample of them
    p95_ms: float | None


def minutes(
    *, session: Session, now: datetime, count: int, known: Mapping[datetime, Minute] | None = None
) -> list[Minute]:
    """The last `count` whole minutes and the current one, oldest first. Minutes in `known`
    (by start) are taken from it: only the minutes after the last known one are read, in one
    range scan of the finished_at index (how many ended at or after each minute's start; the
    differences are the minutes' counts) and a bounded latency sample each."""
    known = known or {}
    top = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    starts = [top - timedelta(minutes=count + 1 - i) for i in range(count + 1)]
    first = next((i for i, start in enumerate(starts) if start not in known), len(starts))
    edges = [*starts[first:], top]
    read: list[Minute] = []
    if len(edges) > 1:
        kinds = [
            Job.finished_at.is_not(None),
            Job.status == JobStatus.FAILED.value,
            Job.status == JobStatus.CANCELED.value,
        ]
        # For each kind, how many ended at or after each edge (the first: the whole range).
        row = session.execute(
            select(
                *(
                    func.sum(case(((Job.finished_at >= edge) & kind, 1), else_=0))
                    for kind in kinds
                    for edge in edges[:-1]
                )
            ).where(Job.finished_at >= edges[0], Job.parent_id.is_(None))
        ).one()
        n = len(edges) - 1
        after = [[int(v or 0) for v in row[k * n : (k + 1) * n]] + [0] for k in range(3)]
        for i in range(n):
            ended, failed, canceled = (counts[i] - counts[i + 1] for counts in after)
            p50, p95 = _latency(session, edges[i], edges[i + 1]) if ended else (None, None)
            read.append(Minute(edges[i], ended, failed, canceled, p50, p95))
    return [known[start] for start in starts[:first]] + read


def _latency(session: Session, start: datetime, end: datetime) -> tuple[float | None, float | None]:
    rows = session.execute(
        select(Job.created_at, Job.finished_at)
        .where(Job.finished_at >= start, Job.finished_at < end, Job.parent_id.is_(None))
        .order_by(Job.finished_at.desc())
        .limit(LATENCY_SAMPLE)
    ).all()
    took = sorted(
        (finished - created).total_seconds() * 1000
        for created, finished in rows
        if finished is not None
    )
    if not took:
        return None, None
    return took[len(took) // 2], took[min(len(took) - 1, int(len(took) * 0.95))]


def latest_failures(*, session: Session, since: datetime, limit: int = 10) -> list[Job]:
    """The latest failed jobs that ended since `since`, newest first (by the finished_at index)."""
    return list(
        session.scalars(
            select(Job)
            .where(Job.finished_at >= since, Job.status == JobStatus.FAILED.value)
            .order_by(Job.finished_at.desc())
            .limit(limit)
        )
    )
