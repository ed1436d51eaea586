"""Where a queued job stands: how many jobs the claim would take before it, and when it may end.

The claim (`db.jobs.claim_next`) fills a batch of a model version from the tenants that wait, in
turn: the tenant least served for its weight goes next (samples taken so far / weight), of equals
the one whose next job is oldest; a tenant's own jobs go by priority (highest first), then
deadline (`Cancel-After`: earliest first, those without one after), then age. So a job's
`queue_position` counts, among the queued jobs of its model version:

- its own tenant's jobs ahead of it in that tenant's order (exact: priority, deadline, age), which
  hold about `a` samples (their number times the tenant's average queued job size); and
- for every other tenant U (weight w_U, n_U queued jobs of m_U samples on average), the jobs of U
  that the weighted turns take while this job's tenant (weight w) serves those `a` samples: the
  k-th job of U (from 0) goes first when k * m_U / w_U < a / w, and on equal shares when it is
  the older; U's queued jobs older than this one stand in for "the k-th is the older".

Where it is an estimate, not a promise:
- Priority and deadlines order a tenant's own jobs only: another tenant's high-priority job does
  not pass this one, and this tenant's own new high-priority jobs or jobs with an earlier
  deadline, or a newly waiting tenant, do (the position can grow).
- Each batch starts the turns afresh (a tenant's served samples count within one batch), while
  the position counts turns over the whole queue: where the queue spans several batches, a batch
  whose room does not divide evenly gives its odd samples to the tenant whose next job is oldest,
  so the real order drifts from the estimate by up to one job per other tenant per batch.
- Jobs count as if each were its tenant's average size; with equal sizes per tenant, equal
  priorities in the other tenants and one batch, the position is exact. Another tenant's
  priorities can move it by one job per such tenant (the "older" stand-in above).
- A job that does not fit the room left in a batch waits for the next one while smaller jobs
  behind it go; a job claimed before runs alone when its wake-up comes (db/jobs/claims.py,
  Isolation); the parts of a split job (db/parts.py) count as jobs of their tenant. Running jobs
  are not counted.

`eta_s` is (samples of the jobs ahead + the job's own) / the samples per second its model version
finished lately (`Recent.rate`): the time to drain what is ahead at the recent pace (running
jobs left out). None when nothing of that version finished within the window.

Cost: one statement per queued job read, a GROUP BY tenant over the queued entries of its model
version in `ix_jobs_pick` (model, version, status, tenant, priority, pick_deadline, id): the
index alone answers it, no row is read, but it walks that version's whole queue (about 1.5 ms for
10,000 queued jobs on SQLite). For many queued jobs of one version in one read (a listing, a bulk
submit), one statement reads that version's queue from the index once and each is placed from it.
What needs the rows (job sizes, tenants' weights, the recent pace: `Recent`) is read at most
every few seconds per process.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Table, bindparam, case, func, or_, select
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
    pick_deadline: datetime  # its deadline, or NO_DEADLINE: its place among equal priorities
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
    mean_samples: float  # S / n: their average size (`Recent.sizes`)
    older: int  # those submitted before the job being placed
    ahead: int  # those before it in the tenant's own order (priority, deadline, then age)


def position(*, tenant: str, lines: Iterable[TenantLine]) -> tuple[int, float]:
    """(jobs, samples) the claim takes before a job of `tenant`, by the turns described above."""
    by_tenant = {line.tenant: line for line in lines}
    own = by_tenant.get(tenant)
    if own is None:
        return 0, 0.0
    # Served before this job's turn: its tenant's jobs ahead, in samples, per unit of weight.
    share = own.ahead * own.mean_samples / max(own.weight, 1)
    jobs, samples = own.ahead, own.ahead * own.mean_samples
    for line in by_tenant.values():
        if line.tenant == tenant or line.jobs == 0:
            continue
        # The k-th job of U (from 0) goes first while k * mean_U / w_U < share.
        x = share * max(line.weight, 1) / max(line.mean_samples, _TINY)
        lo = math.ceil(x - _EPSILON)  # k < x
        hi = math.floor(x + _EPSILON) + 1  # k <= x: on equal shares it goes first if older
        taken = min(line.jobs, max(lo, min(line.older, hi)))
        jobs += taken
        samples += taken * line.mean_samples
    return jobs, samples


_TINY = 1e-9
# Shares are ratios of small integers: equal ones may differ in the last bits of a float.
_EPSILON = 1e-9


def _is_placed(job: Queued) -> bool:
    # The parts of a split job are the fleet's, not the client's: never shown (db/parts.py).
    return job.status == JobStatus.QUEUED.value and job.parent_id is None


_QUEUE = (
    _jobs.c.model == bindparam("p_model"),
    _jobs.c.version == bindparam("p_version"),
    _jobs.c.status == JobStatus.QUEUED.value,
)
# Every column these read is in `ix_jobs_pick`: the index alone answers them (no row is read).
_AHEAD = or_(
    _jobs.c.priority > bindparam("p_priority"),
    (_jobs.c.priority == bindparam("p_priority"))
    & (
        (_jobs.c.pick_deadline < bindparam("p_pick"))
        | ((_jobs.c.pick_deadline == bindparam("p_pick")) & (_jobs.c.id < bindparam("p_id")))
    ),
)
_LINES = (
    select(
        _jobs.c.tenant,
        func.count().label("jobs"),
        func.sum(case((_jobs.c.id < bindparam("p_id"), 1), else_=0)).label("older"),
        func.sum(case((_AHEAD, 1), else_=0)).label("ahead"),
    )
    .where(*_QUEUE)
    .group_by(_jobs.c.tenant)
)
_QUEUE_ROWS = select(_jobs.c.tenant, _jobs.c.priority, _jobs.c.pick_deadline, _jobs.c.id).where(
    *_QUEUE
)

# A read with more queued jobs of one version than this reads that version's queue once: reading
# it into Python costs about as much as ten statements of one job each (both walk the whole
# queue; 16 ms against 1.6 ms at 10,000 queued on SQLite).
_ONE_BY_ONE_MAX = 10


# A tenant whose jobs came after the sizes were read, and were claimed before a second read.
_UNSEEN = (1, 1.0)


def _lines_of(session: Session, job: Queued, recent: Recent) -> list[TenantLine]:
    """The tenants' lines as seen from one job: one statement."""
    params = {
        "p_model": job.model,
        "p_version": job.version,
        "p_priority": job.priority,
        "p_pick": job.pick_deadline,
        "p_id": job.id,
    }
    rows = session.execute(_LINES, params).all()
    sizes = recent.sizes(
        session=session, model=job.model, version=job.version, tenants=[r.tenant for r in rows]
    )
    return [
        TenantLine(
            tenant=row.tenant,
            weight=sizes.get(row.tenant, _UNSEEN)[0],
            jobs=int(row.jobs),
            mean_samples=sizes.get(row.tenant, _UNSEEN)[1],
            older=int(row.older or 0),
            ahead=int(row.ahead or 0),
        )
        for row in rows
    ]


class QueueSnapshot:
    """A model version's queued jobs read once (from the index), to place many of them: what
    one statement per job would say of each."""

    def __init__(self, *, session: Session, model: str, version: int, recent: Recent) -> None:
        rows = session.execute(_QUEUE_ROWS, {"p_model": model, "p_version": version}).all()
        orders: defaultdict[str, list[tuple[int, datetime, str]]] = defaultdict(list)
        for tenant, priority, pick_deadline, job_id in rows:
            orders[tenant].append((-priority, pick_deadline, job_id))
        self._sizes = recent.sizes(session=session, model=model, version=version, tenants=orders)
        # Per tenant: its jobs by (-priority, deadline, id), and their ids by age.
        self._queues = {
            tenant: (sorted(order), sorted(job_id for *_, job_id in order))
            for tenant, order in orders.items()
        }

    def lines(self, job: Queued) -> list[TenantLine]:
        return [
            TenantLine(
                tenant=tenant,
                weight=self._sizes.get(tenant, _UNSEEN)[0],
                jobs=len(ids),
                mean_samples=self._sizes.get(tenant, _UNSEEN)[1],
                older=bisect.bisect_left(ids, job.id),
                ahead=bisect.bisect_left(order, (-job.priority, job.pick_deadline, job.id)),
            )
            for tenant, (order, ids) in self._queues.items()
        ]


def place(*, session: Session, jobs: Sequence[Queued], recent: Recent) -> dict[str, Standing]:
    """The standing of each queued job among `jobs` (the others are left out): one statement per
    model version with more than a few of them, else one per job; plus what `recent` reads."""
    groups: defaultdict[tuple[str, int], list[Queued]] = defaultdict(list)
    for job in jobs:
        if _is_placed(job):
            groups[(job.model, job.version)].append(job)
    placed: dict[str, Standing] = {}
    for (model, version), group in groups.items():
        rate = recent.rate(session=session, model=model, version=version)
        snapshot = (
            QueueSnapshot(session=session, model=model, version=version, recent=recent)
            if len(group) > _ONE_BY_ONE_MAX
            else None
        )
        for job in group:
            lines = snapshot.lines(job) if snapshot else _lines_of(session, job, recent)
            jobs_ahead, samples_ahead = position(tenant=job.tenant, lines=lines)
            eta = (samples_ahead + job.samples) / rate if rate else None
            placed[job.id] = Standing(queue_position=jobs_ahead, eta_s=eta)
    return placed


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
    .where(*_QUEUE)
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
