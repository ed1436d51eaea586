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
10,000 queued jobs on SQLite). For many queued jobs of one version in one read (a listing), one
statement reads that version's queue from the index once and each is placed from it; a submit's
jobs, stored together, cost one statement per class of theirs (`StoredTogether`), never a read of
the queue, which would cost a bulk submission into a deep backlog a read of it per request. What
needs the rows (job sizes, tenants' weights, the recent pace: db/recent.py) is read at most every
few seconds per process.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import Table, bindparam, case, func, or_, select
from sqlalchemy.orm import Session

from db.models import Job, JobStatus
from db.recent import QUEUE, Recent

_jobs: Table = Job.__table__  # type: ignore[assignment]


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
    .where(*QUEUE)
    .group_by(_jobs.c.tenant)
)
QUEUE_ORDER = (
    select(_jobs.c.tenant, _jobs.c.id)
    .where(*QUEUE)
    .order_by(_jobs.c.tenant, _jobs.c.priority.desc(), _jobs.c.pick_deadline, _jobs.c.id)
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
    one statement per job would say of each. Their ids only, each tenant's in its own order
    (priority, deadline, age), sorted by the database: a job's place in its tenant's order is
    found by its id, and no deadline is read into Python (a conversion per queued job, most of
    the cost of the read)."""

    def __init__(self, *, session: Session, model: str, version: int, recent: Recent) -> None:
        rows = session.execute(QUEUE_ORDER, {"p_model": model, "p_version": version}).all()
        orders: defaultdict[str, list[str]] = defaultdict(list)
        for tenant, job_id in rows:
            orders[tenant].append(job_id)
        self._sizes = recent.sizes(session=session, model=model, version=version, tenants=orders)
        # Per tenant: where each of its jobs stands in its order, and their ids by age.
        self._queues = {
            tenant: ({job_id: at for at, job_id in enumerate(order)}, sorted(order))
            for tenant, order in orders.items()
        }

    def lines(self, job: Queued) -> list[TenantLine] | None:
        """None for a job the read did not see queued (PostgreSQL reads each statement anew: a
        job claimed since it was read)."""
        own = self._queues.get(job.tenant)
        ahead = own[0].get(job.id) if own else None
        if ahead is None:
            return None
        return [
            TenantLine(
                tenant=tenant,
                weight=self._sizes.get(tenant, _UNSEEN)[0],
                jobs=len(ids),
                mean_samples=self._sizes.get(tenant, _UNSEEN)[1],
                older=bisect.bisect_left(ids, job.id),
                ahead=ahead if tenant == job.tenant else 0,  # another's: not used (`position`)
            )
            for tenant, (_, ids) in self._queues.items()
        ]


class StoredTogether:
    """Jobs of a model version stored together just now, placed from one statement per class of
    theirs (tenant, priority, deadline): the oldest of a class is placed as `_lines_of` places
    it, and each other counted on from it, by the jobs among them between the two. Exact as long
    as no other job was stored between them meanwhile (a concurrent submit may be, and moves a
    position by its jobs); a bulk submit costs a walk of the queue in the index per class, not a
    read of the whole queue (QueueSnapshot) per request."""

    def __init__(self, *, session: Session, classes: list[list[Queued]], recent: Recent) -> None:
        self._ids: defaultdict[str, list[str]] = defaultdict(list)  # each tenant's, by age
        self._from: dict[str, tuple[Queued, list[TenantLine], int]] = {}
        for members in classes:
            lines = _lines_of(session, members[0], recent)
            for rank, job in enumerate(members):
                self._from[job.id] = (members[0], lines, rank)
                self._ids[job.tenant].append(job.id)
        for ids in self._ids.values():
            ids.sort()

    @staticmethod
    def classes(group: Sequence[Queued]) -> list[list[Queued]]:
        """The jobs by class (tenant, priority, deadline), each class's by age."""
        classes: defaultdict[tuple[str, int, datetime], list[Queued]] = defaultdict(list)
        for job in sorted(group, key=lambda job: job.id):
            classes[(job.tenant, job.priority, job.pick_deadline)].append(job)
        return list(classes.values())

    def lines(self, job: Queued) -> list[TenantLine]:
        first, lines, rank = self._from[job.id]
        counted = []
        for line in lines:
            ids = self._ids.get(line.tenant, [])
            between = bisect.bisect_left(ids, job.id) - bisect.bisect_left(ids, first.id)
            ahead = line.ahead + rank if line.tenant == job.tenant else line.ahead
            counted.append(dataclasses.replace(line, older=line.older + between, ahead=ahead))
        return counted


def place(
    *, session: Session, jobs: Sequence[Queued], recent: Recent, together: bool = False
) -> dict[str, Standing]:
    """The standing of each queued job among `jobs` (the others are left out): one statement per
    model version with more than a few of them, else one per job; plus what `recent` reads.
    `together`: the jobs were stored together just now (a submit's), placed as `StoredTogether`
    says where they fall in few classes."""
    groups: defaultdict[tuple[str, int], list[Queued]] = defaultdict(list)
    for job in jobs:
        if _is_placed(job):
            groups[(job.model, job.version)].append(job)
    placed: dict[str, Standing] = {}
    for (model, version), group in groups.items():
        rate = recent.rate(session=session, model=model, version=version)
        placer: StoredTogether | QueueSnapshot | None = None
        classes = StoredTogether.classes(group) if together else []
        if together and len(classes) <= _ONE_BY_ONE_MAX:
            placer = StoredTogether(session=session, classes=classes, recent=recent)
        elif len(group) > _ONE_BY_ONE_MAX:
            placer = QueueSnapshot(session=session, model=model, version=version, recent=recent)
        for job in group:
            lines = placer.lines(job) if placer else None
            if lines is None:
                lines = _lines_of(session, job, recent)
            jobs_ahead, samples_ahead = position(tenant=job.tenant, lines=lines)
            eta = (samples_ahead + job.samples) / rate if rate else None
            placed[job.id] = Standing(queue_position=jobs_ahead, eta_s=eta)
    return placed
