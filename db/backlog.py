"""Each model's backlog and the worker children ready for it: what an autoscaler scales on.

Read at scrape time (`api/autoscaling.py`) with three cheap statements: a GROUP BY over the
queued and running jobs only (found through an index led by `status`, `ix_jobs_status_id` or
`ix_jobs_lease`, so its cost follows the backlog, never the finished jobs kept for their
retention), one over the presence rows (a row per child and version it holds), and the
registered names (the primary key). Ages and liveness are judged by the database's clock, which
wrote the rows.

A stalled model (`Backlog.stalled_s`): jobs queued, children ready, and none of them taking any.
The symptom of Celery workers whose consumers stay connected but never consume again after a
Redis failover (celery/celery#6348): the children still report (their presence is live) while
no message reaches them. Each child reports, per version it holds, the last report at which it
had claimed jobs of it (`ModelPresence.claimed_at`, worker/holdings.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db import clock, presence
from db.models import Job, JobStatus, ModelPresence, ModelVersion


@dataclass(frozen=True)
class Backlog:
    """One model's jobs waiting or running, and the live children that hold any version of it."""

    queued: int = 0
    running: int = 0
    oldest_queued_age_s: float = 0.0  # 0 when nothing is queued
    ready_children: int = 0  # distinct live children with a version loaded or draining
    # How long jobs of a version have waited while children held it and none claimed (0: not
    # stalled; the largest over the versions): `stalled_s`.
    stalled_s: float = 0.0

    @property
    def jobs(self) -> int:
        return self.queued + self.running

    @property
    def per_child(self) -> float:
        """Jobs per ready child; with none ready, as if there were one, so that an autoscaler
        that divides the backlog by a target scales from zero."""
        return self.jobs / self.ready_children if self.ready_children else float(self.jobs)

    @property
    def without_capacity(self) -> bool:
        """Jobs wait and no child can run them."""
        return self.jobs > 0 and self.ready_children == 0


def per_model(
    *, session: Session, poll_s: float, now: datetime | None = None
) -> dict[str, Backlog]:
    """Every model that is registered, held by a live child or has unfinished jobs, by name.

    `poll_s` is TFFLEET_MODEL_POLL_S (how often children report: `presence.live_since`);
    `now` the database's time (`clock.now`, read here when None).
    """
    now = now or clock.now(session)
    # Per model, then per version: (count, oldest created_at) of each status.
    jobs: dict[str, dict[int, dict[str, tuple[int, datetime | None]]]] = {}
    for model, version, status, count, oldest in session.execute(
        select(Job.model, Job.version, Job.status, func.count(), func.min(Job.created_at))
        .where(Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value]))
        .group_by(Job.model, Job.version, Job.status)
    ):
        jobs.setdefault(model, {}).setdefault(version, {})[status] = (int(count), oldest)
    # A row per live child and version it holds: few (children x versions), summed here.
    children: dict[str, set[str]] = {}
    claims: dict[tuple[str, int], datetime | None] = {}
    for name, version, child, claimed in session.execute(
        select(
            ModelPresence.name, ModelPresence.version, ModelPresence.child, ModelPresence.claimed_at
        ).where(
            ModelPresence.seen_at >= presence.live_since(poll_s, now=now),
            ModelPresence.state.in_(presence.HOLDING),
        )
    ):
        children.setdefault(name, set()).add(child)
        before = claims.get((name, version))
        claims[(name, version)] = claimed if before is None else max(before, claimed or before)
    names = set(session.scalars(select(ModelVersion.name).distinct())) | set(jobs) | set(children)
    found = {}
    for name in sorted(names):
        queued = running = 0
        first: datetime | None = None
        stalled = 0.0
        for version, counts in jobs.get(name, {}).items():
            waiting, since = counts.get(JobStatus.QUEUED.value, (0, None))
            queued += waiting
            running += counts.get(JobStatus.RUNNING.value, (0, None))[0]
            if since is not None and (first is None or since < first):
                first = since
            # Per version: children ready for one version do not claim another's jobs (one
            # still loading, say).
            stalled = max(
                stalled,
                stalled_s(
                    queued=waiting,
                    ready=(name, version) in claims,
                    oldest_queued=since,
                    claimed=claims.get((name, version)),
                    now=now,
                ),
            )
        found[name] = Backlog(
            queued=queued,
            running=running,
            oldest_queued_age_s=max(0.0, (now - first).total_seconds()) if first else 0.0,
            ready_children=len(children.get(name, ())),
            stalled_s=stalled,
        )
    return found


def stalled_s(
    *,
    queued: int,
    ready: bool,
    oldest_queued: datetime | None,
    claimed: datetime | None,
    now: datetime,
) -> float:
    """One model version's: with jobs of it queued and live children holding it (`ready`), the
    seconds since the later of the newest claim of it by one of them (`claimed`) and its oldest
    queued job's creation; else 0. A model's is the largest of its versions'.

    The later of the two, because either one shows the fleet was not stalled then: a child
    claimed, or nothing was waiting yet (the oldest queued job came after every claim). So a
    model claimed steadily reads a poll or two at most, however deep its backlog (a deep backlog
    is slow, not stalled), and a fleet idle for hours reads 0 until a job comes, then that job's
    age. A child's claim is stamped at its next report (every TFFLEET_MODEL_POLL_S), and a
    task in progress counts at each report, so a batch or a transform's shard that runs long is
    no stall either. Never more than `oldest_queued_age_s`.
    """
    if queued <= 0 or not ready or oldest_queued is None:
        return 0.0
    since = oldest_queued if claimed is None else max(claimed, oldest_queued)
    return max(0.0, (now - since).total_seconds())
