"""Each model's backlog and the worker children ready for it: what an autoscaler scales on.

Read at scrape time (`api/autoscaling.py`) with three cheap statements: a GROUP BY over the
queued and running jobs only (found through an index led by `status`, `ix_jobs_status_id` or
`ix_jobs_lease`, so its cost follows the backlog, never the finished jobs kept for their
retention), one over the presence rows (a row per child and version it holds), and the
registered names (the primary key). Ages and liveness are judged by the database's clock, which
wrote the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import distinct, func, select
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
    jobs: dict[str, dict[str, tuple[int, datetime | None]]] = {}
    for model, status, count, oldest in session.execute(
        select(Job.model, Job.status, func.count(), func.min(Job.created_at))
        .where(Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value]))
        .group_by(Job.model, Job.status)
    ):
        jobs.setdefault(model, {})[status] = (int(count), oldest)
    children = {
        name: int(count)
        for name, count in session.execute(
            select(ModelPresence.name, func.count(distinct(ModelPresence.child)))
            .where(
                ModelPresence.seen_at >= presence.live_since(poll_s, now=now),
                ModelPresence.state.in_(presence.HOLDING),
            )
            .group_by(ModelPresence.name)
        )
    }
    names = set(session.scalars(select(ModelVersion.name).distinct())) | set(jobs) | set(children)
    found = {}
    for name in sorted(names):
        queued, first = jobs.get(name, {}).get(JobStatus.QUEUED.value, (0, None))
        running, _ = jobs.get(name, {}).get(JobStatus.RUNNING.value, (0, None))
        found[name] = Backlog(
            queued=queued,
            running=running,
            oldest_queued_age_s=max(0.0, (now - first).total_seconds()) if first else 0.0,
            ready_children=children.get(name, 0),
        )
    return found
