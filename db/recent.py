"""What placing a queued job (db/standing.py) reads at most every few seconds per process: each
model version's recent pace, and each tenant's weight and average queued job size."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.orm import Session

from db import clock
from db.models import Job, JobStatus, Tenant

_jobs: Table = Job.__table__  # type: ignore[assignment]
_tenants: Table = Tenant.__table__  # type: ignore[assignment]

# A model version's queued jobs (`p_model`, `p_version`).
QUEUE = (
    _jobs.c.model == bindparam("p_model"),
    _jobs.c.version == bindparam("p_version"),
    _jobs.c.status == JobStatus.QUEUED.value,
)


@dataclass(frozen=True)
class _Sizes:
    """Each tenant's weight and average queued job size for one model version, as last read."""

    read_at: float
    of: dict[str, tuple[int, float]]  # tenant -> (weight, samples per job)


_SIZES = (
    select(
        _jobs.c.tenant,
        func.coalesce(func.max(_tenants.c.weight), 1),
        func.count(),
        func.sum(_jobs.c.samples),
    )
    .select_from(_jobs.outerjoin(_tenants, _tenants.c.name == _jobs.c.tenant))
    .where(*QUEUE)
    .group_by(_jobs.c.tenant)
)


# The most ended jobs a pace is read from: a read every `refresh_s` costs the same however busy.
RECENT_JOBS = 5000


class Recent:
    """What placing a job reads at most every `refresh_s` (per process, as a queued job's every
    read needs it): each model version's samples per second lately, and each tenant's weight and
    average queued job size. Sizes change slowly; a tenant not seen at the last read is read at
    once.

    The pace of a version is the samples of its jobs that succeeded within the last `window_s`
    (of the fleet's latest `RECENT_JOBS` ended jobs there), over the time since the earliest of
    them started (at least `min_span_s`): a version that only just began to run is not judged
    by the whole window. The parent of a split job is left
    out (its parts count), and so are failed jobs: a job failed for a lost worker or a deadline
    says nothing of the pace.
    """

    def __init__(
        self,
        *,
        window_s: float = 300.0,
        refresh_s: float = 5.0,
        min_span_s: float = 1.0,
        monotonic: Any = time.monotonic,
    ) -> None:
        self.window_s, self.refresh_s, self.min_span_s = window_s, refresh_s, min_span_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._rates_at: float | None = None
        self._rates: dict[tuple[str, int], float] = {}
        self._sizes: dict[tuple[str, int], _Sizes] = {}

    def rate(self, *, session: Session, model: str, version: int) -> float | None:
        """Samples per second of this version lately; None if none finished in the window."""
        with self._lock:
            now = self._monotonic()
            if self._rates_at is None or now - self._rates_at >= self.refresh_s:
                self._rates = self._read_rates(session)
                self._rates_at = now
            return self._rates.get((model, version))

    def sizes(
        self, *, session: Session, model: str, version: int, tenants: Iterable[str] = ()
    ) -> dict[str, tuple[int, float]]:
        """{tenant: (weight, samples per queued job)} for this version, read again if older
        than `refresh_s` or if one of `tenants` is missing."""
        with self._lock:
            now = self._monotonic()
            known = self._sizes.get((model, version))
            if (
                known is None
                or now - known.read_at >= self.refresh_s
                or set(tenants) - known.of.keys()
            ):
                rows = session.execute(_SIZES, {"p_model": model, "p_version": version}).all()
                known = _Sizes(
                    read_at=now,
                    of={
                        tenant: (int(weight), float(samples or jobs) / jobs)
                        for tenant, weight, jobs, samples in rows
                    },
                )
                self._sizes[(model, version)] = known
            return known.of

    def _read_rates(self, session: Session) -> dict[tuple[str, int], float]:
        now = clock.now(session)
        since = now - timedelta(seconds=self.window_s)
        # The latest jobs that ended in the window, at most RECENT_JOBS, read by the finished_at
        # index: a busy fleet ends more jobs in five minutes than a read every few seconds
        # should touch, and the status, which SQLite's planner would read every succeeded job
        # by, is checked on these.
        latest = (
            select(
                _jobs.c.model,
                _jobs.c.version,
                _jobs.c.samples,
                _jobs.c.started_at,
                _jobs.c.parts,
                _jobs.c.status,
            )
            .where(_jobs.c.finished_at >= since)
            .order_by(_jobs.c.finished_at.desc())
            .limit(RECENT_JOBS)
            .subquery()
        )
        rows = session.execute(
            select(
                latest.c.model,
                latest.c.version,
                func.sum(latest.c.samples),
                func.min(latest.c.started_at),
            )
            .where(
                latest.c.started_at.is_not(None),
                latest.c.parts.is_(None),
                latest.c.status == JobStatus.SUCCEEDED.value,
            )
            .group_by(latest.c.model, latest.c.version)
        ).all()
        rates = {}
        for model, version, samples, first_started in rows:
            start: datetime = max(first_started, since) if first_started else since
            span = max((now - start).total_seconds(), self.min_span_s)
            if samples:
                rates[(model, version)] = float(samples) / span
        return rates
