"""What a child hands to the other children serving a model: a share of a message's named jobs,
the named jobs it leaves when its task runs out of batches or time or turns to a transform's
shard, a wake-up for a backlog it leaves behind, and the jobs it hands back after a database
fault.

Each goes out as a wake-up message (`Wake`), published once the jobs are queued in the database.
A message is a hint that work waits, never an assignment: the child that takes it claims what
the database says runs next (worker/batching.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.jobs import Lease
from worker.heartbeat import Heartbeat
from worker.pipeline import Task

log = logging.getLogger(__name__)

# Publishes a wake-up for jobs of a model version: (model, version, job ids).
Wake = Callable[[str, int, Sequence[str]], object]


def share(
    named: list[str], *, task: Task, peers: Callable[[str, int], int], wake: Wake
) -> list[str]:
    """A message naming more jobs than one batch holds is shared at once with the other
    children serving the model (`peers`: how many): each gets a message naming a share, this
    task keeps one, returned. Otherwise a fast model's bulk request runs whole on the child that
    took its message, batch after batch within the task's budget, while the others idle."""
    batches = -(-len(named) // task.policy.max_batch_size)
    if batches < 2:
        return named
    shares = min(peers(task.model, task.version), batches - 1) + 1
    for first in range(1, shares):
        wake(task.model, task.version, named[first::shares])
    return named[::shares]


def pass_on(fresh: Sequence[str], *, task: Task, wake: Wake) -> None:
    """Publish again the named jobs still queued that this task will not run."""
    if len(fresh) <= task.policy.max_batch_size:
        wake(task.model, task.version, fresh)
        return
    # Two messages: another child takes half. Each split halves what a message names, so a
    # request of n jobs makes at most 2n / max_batch_size messages in all.
    half = len(fresh) // 2
    wake(task.model, task.version, fresh[:half])
    wake(task.model, task.version, fresh[half:])


def before_shard(
    named: Sequence[str],
    *,
    running: Sequence[str],
    task: Task,
    sessions: sessionmaker[Session],
    peers: Callable[[str, int], int],
    wake: Wake,
) -> list[str]:
    """A task about to run a transform's shard (`running`: the batch it claimed), seconds alone
    on its device, first hands its named jobs still queued to the other children serving the
    model (`peers`: how many), a message each naming a share: they run beside the shard, not
    after it. Returns the named jobs the task keeps: those claimed before, which run alone at
    its end (worker/batching.py). Alone, a child keeps them all and runs them itself, one after
    another within its task's budget.

    A transform's shards are named by one message, the submit's (a message names jobs, not their
    records, so `share` splits none of them): the child that takes it claims a shard and shares
    out the rest, each child that takes a share does the same with its own, so every idle child
    has a shard within a hop or two. A shard still queued is named by one message, or by the
    task that hands it on, at a time: the messages never outnumber the shards queued."""
    count = peers(task.model, task.version)
    if count <= 0 or set(named) <= set(running):
        return list(named)
    with sessions() as session:
        fresh, retried = jobs.still_queued(session=session, job_ids=named)
    shares = min(count, len(fresh))
    for first in range(shares):
        wake(task.model, task.version, fresh[first::shares])
    return retried


def keep_awake(*, model: str, version: int, sessions: sessionmaker[Session], wake: Wake) -> None:
    """A task that ends while fresh jobs of its version wait publishes a wake-up for them (`wake`
    pushes none while one for the version waits to be taken already): a child never idles
    beside a backlog for want of a message. Submissions publish theirs only while none waits
    (tffleet/broker.py `Publisher.publish(once=True)`), so a task that ends without a last
    claim owes the jobs committed since its claims this one."""
    with sessions() as session:
        waiting = jobs.some_queued(session=session, model=model, version=version, limit=1)
    if waiting:
        wake(model, version, waiting)


def hand_back(
    leases: Sequence[Lease],
    *,
    task: Task,
    sessions: sessionmaker[Session],
    heartbeat: Heartbeat,
    wake: Wake,
) -> None:
    """Return held jobs to the queue after an infrastructure fault, if the database answers;
    if not, their leases expire and the sweeper requeues them."""
    if not leases:
        return
    heartbeat.drop(leases)  # kept alive no more, whether or not the release commits
    try:
        with sessions.begin() as session:
            released = jobs.release(session=session, leases=leases)
    except Exception as exc:
        log.warning(
            "could not hand back %d %s jobs (%s: %s); the sweeper requeues them once their "
            "leases expire",
            len(leases), task.model, type(exc).__name__, exc,
        )  # fmt: skip
        return
    log.warning("handed back %d %s jobs after a database error", released, task.model)
    wake(task.model, task.version, [lease.job_id for lease in leases])
