"""The feeder's stage of a child's pipeline: claim and decode the next batch while the device
runs the one before.

A batch takes what the database says runs next (the waiting tenants in turn, then priority, then
age), topped up while the queue is busy; a job larger than a batch is split into parts for the
other children serving its model (db/parts.py). Every lease it claims is kept alive by the
child's heartbeat from the claim on. A database error hands the leases claimed back and raises.
The objects a batch's inputs point to are fetched here, in this stage's thread, so they arrive
while the device runs the batch before (worker/objects.py): for a part of a split job, only the
range of its rows. A store that does not answer puts the batch back, unstarted, and raises.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from db import jobs, parts
from db.jobs import Lease
from tffleet.objectstore import StoreUnavailable
from worker import handoff, metrics, objects, pipeline, transform_spec
from worker.announcer import Notify
from worker.handoff import Wake
from worker.heartbeat import Heartbeat
from worker.linger import Listener
from worker.objects import Fetched, Objects
from worker.pipeline import Decoded, Task
from worker.retry import INFRA_ERRORS

log = logging.getLogger(__name__)

# While a batch waits for company, how often it looks whether enough came to fill it: first
# after this long, then twice as long each time, up to the second figure.
_COMPANY_POLL_S = 0.0005
_COMPANY_POLL_MAX_S = 0.005
# Pauses before a task's first claim, which found its named jobs held by another child's claim,
# is tried again (each stretched by 0.5 to 1.5 at random): about 0.1 s at most in all.
_LOCKED_RETRY_S = (0.005, 0.01, 0.015, 0.02, 0.02)


@dataclass
class Next:
    """What the feeder found for the device: the next batch, and what remains of the message."""

    batch: Decoded | None  # claimed and decoded; None: nothing more for this task to run
    fresh: list[str]  # the message's named jobs still queued and never claimed
    retried: list[str]  # ... and those claimed before (they run alone, last)
    # No claim was tried: the named jobs left the queue and it is not busy, or the task is out
    # of batches or time.
    stopped: bool = False
    draining: bool = False  # the worker is shutting down: nothing was claimed
    # The batch was claimed after the queue ran dry, on hearing of fresh jobs (worker/linger.py).
    heard: bool = False


@dataclass
class Feeder:
    """Claims the batches of one task (`named`: the jobs its message names), one at a time."""

    task: Task
    named: Sequence[str]
    sessions: sessionmaker[Session]
    reads: sessionmaker[Session]  # for what it only reads (no write lock on SQLite)
    owner: str
    lease_s: float
    heartbeat: Heartbeat
    notify: Notify
    wake: Wake
    peers: Callable[[str, int], int]
    draining: Callable[[], bool]
    # Whether the last batch found other jobs waiting: only then is waiting for more worth it.
    queue_busy: bool = False
    # The child's object store, for inputs held there (None: every input is inline).
    objects: Objects | None = None
    # Hears of fresh jobs of the task's version while the queue is dry (None: the task ends).
    listener: Listener | None = None

    def next(self, *, after: Sequence[str] | None, claim: bool) -> Next:
        """Claim and decode the task's next batch while the jobs the message named wait, or
        while the queue is busy (`after`: the ids of the batch on the device; None before the
        first). Under a steady stream of small jobs, whose messages each name one, a task then
        runs batches back to back, the pipeline full, instead of one batch and a Celery task's
        turnover per message."""
        fresh: list[str] = list(self.named)
        retried: list[str] = []
        if after is not None:
            if set(after) >= set(self.named):
                fresh = []
            else:
                with self.reads() as session:
                    fresh, retried = jobs.still_queued(session=session, job_ids=self.named)
            if not claim or not (fresh or self.queue_busy):
                batch = self._claim_batch() if claim and self._heard(retried) else None
                return Next(
                    batch=batch, fresh=fresh, retried=retried, stopped=batch is None,
                    heard=batch is not None,
                )  # fmt: skip
        if self.draining():
            return Next(batch=None, fresh=fresh, retried=retried, draining=True)
        batch = self._claim_batch()
        if batch is None and after is None:
            return self._claim_again()
        if batch is None and claim and self._heard(retried):
            batch = self._claim_batch()
            return Next(batch=batch, fresh=fresh, retried=retried, heard=batch is not None)
        return Next(batch=batch, fresh=fresh, retried=retried)

    def _heard(self, retried: Sequence[str]) -> bool:
        """Whether fresh jobs of the task's version came in the moment it waits for them
        (worker/linger.py), the queue dry; not while named jobs claimed before wait to run
        alone, nor once the worker is shutting down."""
        if self.listener is None or retried or self.draining():
            return False
        return self.listener.wait(
            self.task.model, self.task.version, waiting=lambda: self._waiting(1) > 0
        )

    def _waiting(self, up_to: int) -> int:
        """How many fresh jobs of the task's version are queued, counted up to `up_to`: a read,
        which takes no lock (a claim is a write transaction)."""
        task = self.task
        with self.reads() as session:
            found = jobs.some_queued(
                session=session, model=task.model, version=task.version, limit=up_to
            )
        return len(found)

    def _claim_again(self) -> Next:
        """The task's first claim found nothing. Where the message's named jobs are still queued
        and never claimed, another child's claim held them: on PostgreSQL a claim locks every
        candidate it reads (SKIP LOCKED) until it commits, though it may take one job, and a
        claim beside it skips them all. It commits within milliseconds: claim again after a
        short pause, a few times, before the named jobs are handed on in a message (a Celery
        round trip, and the same race at the next child). When a transform's shards are shared
        out, every child that takes a share claims at once, and only one claim in each round
        finds the shards (docs/how-to/benchmarks.md, "Transforms over files")."""
        for pause in _LOCKED_RETRY_S:
            with self.reads() as session:
                fresh, retried = jobs.still_queued(session=session, job_ids=self.named)
            if not fresh or self.draining():
                return Next(batch=None, fresh=fresh, retried=retried)
            time.sleep(random.uniform(0.5, 1.5) * pause)  # apart from the others that retry
            batch = self._claim_batch()
            if batch is not None:
                return Next(batch=batch, fresh=list(self.named), retried=[])
        with self.reads() as session:
            fresh, retried = jobs.still_queued(session=session, job_ids=self.named)
        return Next(batch=None, fresh=fresh, retried=retried)

    def claim_retried(self, retried: Sequence[str]) -> tuple[Lease | None, list[str]]:
        """Claim the first of the named jobs claimed before that may run again (it runs alone),
        and the ids this claim canceled instead, past their deadline (announced)."""
        canceled: list[str] = []
        with self.sessions.begin() as session:
            lease = jobs.claim_retried(
                session=session,
                job_ids=retried,
                owner=self.owner,
                lease_s=self.lease_s,
                worker=self.task.worker,
                canceled=canceled,
            )
        self._announce_canceled(canceled)
        return lease, canceled

    def hold(self, leases: list[Lease]) -> Decoded:
        """Keep claimed leases alive from now until their batch is written, fetch the objects
        their inputs point to, and decode them. Raises `StoreUnavailable`, the batch put back."""
        self.heartbeat.keep(leases)
        _observe_claim(self.task.model, leases)
        # A transform's shard holds a spec, not tensors: it is handed on unread, to run alone.
        shards, leases = transform_spec.split_shards(leases)
        fetched = self._fetch(leases)
        leases = self._repointed(leases, fetched)
        decoded = pipeline.decode(
            leases, runner=self.task.runner, objects=fetched.objects, missing=fetched.missing
        )
        decoded.shards = shards
        return decoded

    def _fetch(self, leases: list[Lease]) -> Fetched:
        if self.objects is None:
            return Fetched()
        try:
            return self.objects.fetch(leases)
        except StoreUnavailable as exc:
            # The whole batch, not only the jobs whose objects did not come: the task ends
            # for Celery to try it again later, as after a lost database.
            objects.put_back(leases, sessions=self.sessions, heartbeat=self.heartbeat, error=exc)
            raise

    def _repointed(self, leases: list[Lease], fetched: Fetched) -> list[Lease]:
        """The leases, a part's inputs pointing at the range of its rows that was read in place
        of its job's whole object; the heartbeat keeps these (the same jobs and fences)."""
        if not fetched.inputs:
            return leases
        leases = [
            dataclasses.replace(lease, inputs=fetched.inputs[lease.job_id])
            if lease.job_id in fetched.inputs
            else lease
            for lease in leases
        ]
        self.heartbeat.keep(leases)
        return leases

    def _claim_batch(self) -> Decoded | None:
        leases: list[Lease] = []
        try:
            self._claim(leases)
            if self._split(leases):
                self._claim(leases)
        except INFRA_ERRORS:
            handoff.hand_back(
                leases, task=self.task, sessions=self.sessions, heartbeat=self.heartbeat,
                wake=self.wake,
            )  # fmt: skip
            raise
        if not leases:
            return None
        return self.hold(leases)

    def _split(self, leases: list[Lease]) -> bool:
        """Split a job larger than a batch into parts that idle children run beside this one,
        and wake them; `leases` is emptied, for this child to claim the first part. A job is
        split only while other children serve its model and nothing else of it is queued:
        otherwise they have work of their own, and the split would only cost a copy."""
        task = self.task
        size = task.policy.max_batch_size
        if len(leases) != 1 or leases[0].samples <= size or transform_spec.is_shard(leases[0]):
            return False  # a shard is a part of its transform already
        peers = self.peers(task.model, task.version)
        if peers <= 0:
            return False
        if self._waiting(1):
            return False
        (lease,) = leases
        with self.sessions.begin() as session:
            ids = parts.split(
                session=session, lease=lease, model=task.model, version=task.version,
                part_samples=size,
            )  # fmt: skip
        leases.clear()
        log.info(
            "split job %s (%d samples) into %d parts for %d more children",
            lease.job_id, lease.samples, len(ids), peers,
        )  # fmt: skip
        # A message for each other child (this one claims next); each names a share of parts.
        messages = min(peers, len(ids))
        for first in range(messages):
            self.wake(task.model, task.version, ids[first::messages])
        return True

    def _claim(self, leases: list[Lease]) -> None:
        """Claim into `leases` a batch of queued jobs of this model version never claimed before.

        While the queue is busy (the last batch found company) and this claim leaves room, it
        waits up to max_queue_delay_ms for more (`_wait_for_company`), then claims once more;
        at idle a lone job runs at once instead of waiting for company. `leases` holds what
        was claimed even when a later statement raises.
        """
        deadline = time.monotonic() + self.task.policy.max_queue_delay_ms / 1000
        claimed = self._top_up(leases)
        leases.extend(claimed)
        # The first job is the one the wake-up was for; any more were waiting beside it.
        topped_up = len(claimed) > 1
        if self.queue_busy and leases and self._room(leases) > 0:
            self._wait_for_company(self._room(leases), deadline)
            more = self._top_up(leases)
            leases.extend(more)
            topped_up = topped_up or bool(more)
        if leases:  # a claim that found nothing is no batch: the last one's company still counts
            self.queue_busy = topped_up

    def _wait_for_company(self, room: int, deadline: float) -> None:
        """Until `deadline`, or until at least `room` jobs wait (each holds a sample or more: the
        batch would be full). Looked at by a read, at growing intervals: a claim is a write
        transaction, which on SQLite takes the lock that every submission's insert waits for
        (a claim every 0.5 ms was a quarter of a child's py-spy samples at 32 clients)."""
        pause = _COMPANY_POLL_S
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(pause, left))
            pause = min(2 * pause, _COMPANY_POLL_MAX_S)
            if time.monotonic() >= deadline:
                return
            if self._waiting(room) >= room:
                return

    def _room(self, leases: Sequence[Lease]) -> int:
        return self.task.policy.max_batch_size - sum(lease.samples for lease in leases)

    def _top_up(self, leases: Sequence[Lease]) -> list[Lease]:
        """Claim more jobs, in a transaction of its own; announce those it canceled instead
        (past their deadline) once it commits, as the sweeper announces its deadline cancels."""
        room = self._room(leases)
        if room <= 0:
            return []
        canceled: list[str] = []
        with self.sessions.begin() as session:
            claimed = jobs.claim_next_fresh(
                session=session,
                model=self.task.model,
                version=self.task.version,
                owner=self.owner,
                lease_s=self.lease_s,
                max_samples=room,
                take_oversized=not leases,
                worker=self.task.worker,
                canceled=canceled,
            )
        self._announce_canceled(canceled)
        return claimed

    def _announce_canceled(self, canceled: Sequence[str]) -> None:
        """Jobs a committed claim canceled for their deadline: their long-polls and event
        streams hear of it now, not at their next re-read."""
        if canceled:
            self.notify(list(canceled))


def _observe_claim(model: str, leases: Sequence[Lease]) -> None:
    metrics.BATCH_JOBS.labels(model).observe(len(leases))
    metrics.BATCH_SAMPLES.labels(model).observe(sum(lease.samples for lease in leases))
    for lease in leases:  # both times are the database's
        if lease.created_at is not None and lease.started_at is not None:
            metrics.QUEUE_WAIT_SECONDS.labels(model).observe(
                (lease.started_at - lease.created_at).total_seconds()
            )
