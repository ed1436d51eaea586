"""Where a queued job stands: how many jobs the claim would take before it, and when it may end.

The claim (`db.jobs.claim_next`) fills a batch of a model version from the tenants that wait, in
turn: the tenant least served for its weight goes next (samples taken so far / weight), of equals
the one whose next job is oldest; a tenant's own jobs go by priority (highest first), then age.
So a job's `queue_position` counts, among the queued jobs of its model version:

- its own tenant's jobs ahead of it in that tenant's order (exact: priority, then age), which
  hold `a` samples; and
- for every other tenant U (weight w_U, n_U queued jobs of S_U samples in all), the jobs of U that
  the weighted turns take while this job's tenant (weight w) serves those `a` samples: the k-th
  job of U (from 0) goes first when k * (S_U / n_U) / w_U < a / w, and on equal shares when it is
  the older; U's queued jobs older than this one stand in for "the k-th is the older".

Where it is an estimate, not a promise:
- Priority orders a tenant's own jobs only: another tenant's high-priority job does not pass this
  one, and this tenant's own new high-priority jobs, or a newly waiting tenant, do (the position
  can grow).
- Each batch starts the turns afresh (a tenant's served samples count within one batch), while
  the position counts turns over the whole queue: where the queue spans several batches, a batch
  whose room does not divide evenly gives its odd samples to the tenant whose next job is oldest,
  so the real order drifts from the estimate by up to one job per other tenant per batch.
- Another tenant's jobs count as if each were its average size (S_U / n_U samples); with equal
  sizes per tenant and one batch, the position is exact.
- A job that does not fit the room left in a batch waits for the next one while smaller jobs
  behind it go; a job claimed before runs alone when its wake-up comes (db/jobs.py Isolation);
  the parts of a split job (db/parts.py) count as jobs of their tenant. Running jobs are not
  counted.

`eta_s` is (samples of the jobs ahead + the job's own) / the samples per second its model version
finished lately (`Throughput`): the time to drain what is ahead at the recent pace. None when
nothing of that version finished within the window.

Cost: one statement per queued job read, a GROUP BY tenant over the queued rows of its model
version (found through `ix_jobs_pick`, led by model, version, status); for many queued jobs of
one version in one read (a listing, a bulk submit), one statement reads that version's queue once
and each is placed from it (`place`). The throughput is one GROUP BY per process every
`Throughput.refresh_s`, over the jobs that finished within the window (`ix_jobs_finished_at`).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Select, Table, bindparam, case, func, or_, select
from sqlalchemy.orm import Session

from db import clock
from db.models import Job, JobStatus, Tenant

_jobs: Table = Job.__table__  # type: ignore[assignment]
_tenants: Table = Tenant.__table__  # type: ignore[assignment]


class Queued(Protocol):
    """What placing a job reads of it (an ORM `Job` or a row of `jobs`)."""

    id: str
    tenant: str
    model: str
    version: int
    status: str
    priority: int
    samples: int
    parent_id: str | None


@dataclass(frozen=True)
class Standing:
    queue_position: int  # queued jobs the claim would take before this one
    eta_s: float | None  # seconds until it may end at the recent pace; None: no recent pace


@dataclass(frozen=True)
class TenantLine:
    """One tenant's queued jobs of a model version, as seen from the job being placed."""

    tenant: str
    weight: int
    jobs: int  # n: its queued jobs
    samples: int  # S: their samples
    older: int  # those submitted before the job being placed
    ahead: int  # those before it in the tenant's own order (priority, then age)
    ahead_samples: int


def position(*, tenant: str, lines: Iterable[TenantLine]) -> tuple[int, int]:
    """(jobs, samples) the claim takes before a job of `tenant`, by the turns described above."""
    by_tenant = {line.tenant: line for line in lines}
    own = by_tenant.get(tenant)
    if own is None:
        return 0, 0
    a, weight = own.ahead_samples, max(own.weight, 1)
    jobs, samples = own.ahead, own.ahead_samples
    for line in by_tenant.values():
        if line.tenant == tenant or line.jobs == 0:
            continue
        # k jobs of U go first while k * S_U / n_U / w_U < a / w, in integers:
        # k * S_U * w < a * w_U * n_U.
        num, den = a * max(line.weight, 1) * line.jobs, max(line.samples, 1) * weight
        lo = -(-num // den)  # k < num / den
        hi = num // den + 1  # k <= num / den: the k on equal shares goes first if the older
        taken = min(line.jobs, max(lo, min(line.older, hi)))
        jobs += taken
        samples += round(taken * line.samples / line.jobs)
    return jobs, samples


def _is_placed(job: Queued) -> bool:
    # The parts of a split job are the fleet's, not the client's: never shown (db/parts.py).
    return job.status == JobStatus.QUEUED.value and job.parent_id is None


_QUEUE = (
    _jobs.c.model == bindparam("p_model"),
    _jobs.c.version == bindparam("p_version"),
    _jobs.c.status == JobStatus.QUEUED.value,
)


def _lines_statement() -> Select[Any]:
    """Per tenant with queued jobs of the version: counts as seen from one job (the p_ params)."""
    ahead = or_(
        _jobs.c.priority > bindparam("p_priority"),
        (_jobs.c.priority == bindparam("p_priority")) & (_jobs.c.id < bindparam("p_id")),
    )
    grouped = (
        select(
            _jobs.c.tenant,
            func.count().label("jobs"),
            func.sum(_jobs.c.samples).label("samples"),
            func.sum(case((_jobs.c.id < bindparam("p_id"), 1), else_=0)).label("older"),
            func.sum(case((ahead, 1), else_=0)).label("ahead"),
            func.sum(case((ahead, _jobs.c.samples), else_=0)).label("ahead_samples"),
        )
        .where(*_QUEUE)
        .group_by(_jobs.c.tenant)
        .subquery()
    )
    # Weights joined after grouping: a lookup per tenant, not per job.
    return select(grouped, func.coalesce(_tenants.c.weight, 1).label("weight")).outerjoin(
        _tenants, _tenants.c.name == grouped.c.tenant
    )


_LINES = _lines_statement()
_QUEUE_ROWS = select(_jobs.c.tenant, _jobs.c.priority, _jobs.c.id, _jobs.c.samples).where(*_QUEUE)
_WEIGHTS = select(_tenants.c.name, _tenants.c.weight).where(
    _tenants.c.name.in_(bindparam("p_names", expanding=True))
)

# A read with more queued jobs of one version than this reads that version's queue once.
_ONE_BY_ONE_MAX = 4


def _line(row: Any) -> TenantLine:
    return TenantLine(
        tenant=row.tenant,
        weight=int(row.weight),
        jobs=int(row.jobs),
        samples=int(row.samples or 0),
        older=int(row.older or 0),
        ahead=int(row.ahead or 0),
        ahead_samples=int(row.ahead_samples or 0),
    )


def lines_of(*, session: Session, job: Queued) -> list[TenantLine]:
    """The tenants' lines as seen from one job: one statement."""
    params = {
        "p_model": job.model,
        "p_version": job.version,
        "p_priority": job.priority,
        "p_id": job.id,
    }
    return [_line(row) for row in session.execute(_LINES, params)]


@dataclass
class _TenantQueue:
    weight: int
    order: list[tuple[int, str]] = field(default_factory=list)  # (-priority, id), sorted
    samples_before: list[int] = field(default_factory=list)  # prefix sums along `order`
    ids: list[str] = field(default_factory=list)  # sorted: age order

    @property
    def total(self) -> int:
        return self.samples_before[-1]


class QueueSnapshot:
    """A model version's queued jobs read once, to place many of them (what `lines_of` says for
    each, from one statement instead of one each)."""

    def __init__(self, *, session: Session, model: str, version: int) -> None:
        rows = session.execute(_QUEUE_ROWS, {"p_model": model, "p_version": version}).all()
        by_tenant: defaultdict[str, list[Any]] = defaultdict(list)
        for row in rows:
            by_tenant[row.tenant].append(row)
        weights = (
            {
                name: weight
                for name, weight in session.execute(_WEIGHTS, {"p_names": sorted(by_tenant)})
            }
            if by_tenant
            else {}
        )
        self._queues: dict[str, _TenantQueue] = {}
        for tenant, mine in by_tenant.items():
            mine.sort(key=lambda r: (-r.priority, r.id))
            queue = _TenantQueue(weight=int(weights.get(tenant, 1)))
            queue.order = [(-r.priority, r.id) for r in mine]
            queue.samples_before = [0]
            for r in mine:
                queue.samples_before.append(queue.samples_before[-1] + int(r.samples))
            queue.ids = sorted(r.id for r in mine)
            self._queues[tenant] = queue

    def lines(self, job: Queued) -> list[TenantLine]:
        lines = []
        for tenant, queue in self._queues.items():
            ahead = bisect.bisect_left(queue.order, (-job.priority, job.id))
            lines.append(
                TenantLine(
                    tenant=tenant,
                    weight=queue.weight,
                    jobs=len(queue.ids),
                    samples=queue.total,
                    older=bisect.bisect_left(queue.ids, job.id),
                    ahead=ahead,
                    ahead_samples=queue.samples_before[ahead],
                )
            )
        return lines


def place(
    *, session: Session, jobs: Sequence[Queued], throughput: Throughput | None = None
) -> dict[str, Standing]:
    """The standing of each queued job among `jobs` (the others are left out): one statement per
    model version with more than a few of them, else one per job; plus the throughput's."""
    groups: defaultdict[tuple[str, int], list[Queued]] = defaultdict(list)
    for job in jobs:
        if _is_placed(job):
            groups[(job.model, job.version)].append(job)
    placed: dict[str, Standing] = {}
    for (model, version), group in groups.items():
        rate = None
        if throughput is not None:
            rate = throughput.rate(session=session, model=model, version=version)
        snapshot = (
            QueueSnapshot(session=session, model=model, version=version)
            if len(group) > _ONE_BY_ONE_MAX
            else None
        )
        for job in group:
            lines = snapshot.lines(job) if snapshot else lines_of(session=session, job=job)
            jobs_ahead, samples_ahead = position(tenant=job.tenant, lines=lines)
            eta = (samples_ahead + job.samples) / rate if rate else None
            placed[job.id] = Standing(queue_position=jobs_ahead, eta_s=eta)
    return placed


class Throughput:
    """Samples per second each model version finished lately, read for every version at once at
    most every `refresh_s` (per process: a queued job's every read asks for it).

    The pace of a version is the samples of its jobs that finished within the last `window_s`,
    over the time since the earliest of them started (at least `min_span_s`): a version that
    only just began to run is not judged by the whole window. The parent of a split job is left
    out (its parts count).
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
        self._read_at: float | None = None
        self._rates: dict[tuple[str, int], float] = {}

    def rate(self, *, session: Session, model: str, version: int) -> float | None:
        with self._lock:
            now = self._monotonic()
            if self._read_at is None or now - self._read_at >= self.refresh_s:
                self._rates = self._read(session)
                self._read_at = now
            return self._rates.get((model, version))

    def _read(self, session: Session) -> dict[tuple[str, int], float]:
        now = clock.now(session)
        since = now - timedelta(seconds=self.window_s)
        rows = session.execute(
            select(
                _jobs.c.model,
                _jobs.c.version,
                func.sum(_jobs.c.samples),
                func.min(_jobs.c.started_at),
            )
            .where(
                _jobs.c.finished_at >= since,
                _jobs.c.started_at.is_not(None),
                _jobs.c.parts.is_(None),
                _jobs.c.status.in_([JobStatus.SUCCEEDED.value, JobStatus.FAILED.value]),
            )
            .group_by(_jobs.c.model, _jobs.c.version)
        ).all()
        rates = {}
        for model, version, samples, first_started in rows:
            start: datetime = max(first_started, since) if first_started else since
            span = max((now - start).total_seconds(), self.min_span_s)
            if samples:
                rates[(model, version)] = float(samples) / span
        return rates
