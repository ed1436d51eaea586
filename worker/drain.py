"""A worker's warm shutdown (the drain): the flag every child reads, how long it may take, and
what a child gives up once it began.

Once the worker's warm shutdown began (`DRAIN`), a child ends the batch it holds and claims no
more: a batch the feeder claimed meanwhile goes back to the queue unstarted (`put_back`), and the
jobs the task's message named are left to other workers (`leave`). So the worker exits within
`drain_bound_s` of SIGTERM.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Sequence

from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.jobs import Lease
from worker.handoff import Wake
from worker.heartbeat import Heartbeat
from worker.pipeline import Task

log = logging.getLogger(__name__)

# What a warm shutdown may take beyond one batch's forward passes: writing that batch, waking the
# jobs its message named, the child's shutdown (its model threads stop within 10 s) and the main
# process's. A few seconds here; each database statement (30 s) and Redis call (5 s) is bounded.
DRAIN_MARGIN_S = 60.0


def drain_bound_s(timeout_s: float) -> float:
    """Seconds from SIGTERM to the exit of a started worker whose batches are limited to
    `timeout_s` (TFFLEET_JOB_TIMEOUT_S, or the largest `timeout_s` of the models' model.toml):
    what a stop grace period must cover. A child still loading its models when SIGTERM comes
    finishes the load first (at most TFFLEET_MODEL_LOAD_TIMEOUT_S); it holds no job meanwhile."""
    return timeout_s + DRAIN_MARGIN_S


class Drain:
    """Whether this worker's warm shutdown began, as its main process and every child see it.

    SIGTERM reaches only the Celery main process, which stops consuming and then waits for each
    child's task to return: nothing tells a child before that. A task runs batch after batch
    while the jobs its message named wait (a message may name thousands), so without this a
    draining worker would go on claiming jobs for as long as that takes. The flag is one byte of
    anonymous shared memory, mapped at import in the main process (worker/app.py imports it
    before Celery forks the pool), so every child, also one forked later to replace another,
    reads the byte the main process sets.
    """

    def __init__(self) -> None:
        self._byte = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: shared across fork

    def begin(self) -> None:
        self._byte[0] = 1

    def began(self) -> bool:
        return self._byte[0] == 1

    def reset(self) -> None:
        self._byte[0] = 0


# Set by the worker's main process when its shutdown begins (worker/app.py).
DRAIN = Drain()


def put_back(
    leases: Sequence[Lease],
    *,
    task: Task,
    named: Sequence[str],
    sessions: sessionmaker[Session],
    heartbeat: Heartbeat,
    wake: Wake,
) -> None:
    """The worker began shutting down while the feeder claimed the next batch (`leases`): that
    batch does not start, so the drain still ends within one batch. Its jobs go back to the
    queue as if never claimed; the named ones are left to other workers with the rest (`leave`),
    the others woken here."""
    heartbeat.drop(leases)
    with sessions.begin() as session:
        jobs.unclaim(session=session, leases=leases)
    keep = set(named)
    unnamed = [lease.job_id for lease in leases if lease.job_id not in keep]
    if unnamed:
        wake(task.model, task.version, unnamed)


def leave(named: Sequence[str], *, task: Task, sessions: sessionmaker[Session], wake: Wake) -> None:
    """Shutting down: leave the named jobs still queued to other workers, with a wake-up
    (this task's message is acknowledged when it returns)."""
    with sessions() as session:
        fresh, retried = jobs.still_queued(session=session, job_ids=named)
    waiting = fresh + retried
    if waiting:
        log.info(
            "shutting down: %d %s:%s jobs left queued for other workers",
            len(waiting), task.model, task.version,
        )  # fmt: skip
        wake(task.model, task.version, waiting)
