"""A child's batches: claim what runs next, run it on the device, write the results, announce.

A job that was claimed before and did not end (its child died, its batch ran out of time) runs
alone from then on. A forward pass that outlives the model's time limit is ended by the heartbeat
thread, which then ends the child (see `Batcher`). A database error hands the leases back and
raises, for the task to retry (worker/retry.py maps every path by which a job runs again).
Once the worker's warm shutdown began, a child ends the batch it holds and claims no more
(worker/drain.py), so the worker exits within `drain_bound_s` of SIGTERM.

The stages overlap, each in a thread of its own: the feeder (worker/feeder.py), the device's in
the task's thread (here), the writer (worker/writer.py); the stages' work is worker/pipeline.py.
What a task passes on to other children is worker/handoff.py. A transform's shard among the jobs
claimed runs alone, through a pipeline of its own (worker/transform.py), before the next claim.
Plain logic over a `Runner` (anything with `inputs` and `run(batch) -> outputs`), so tests can
pass a function instead of TensorFlow.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.jobs import Lease
from db.models import JobErrorCode
from tffleet.settings import Settings
from worker import drain, handoff, metrics, pipeline, timeouts
from worker.announcer import Notify
from worker.drain import DRAIN, Drain, drain_bound_s
from worker.feeder import Feeder, Next
from worker.handoff import Wake
from worker.heartbeat import Heartbeat, Running
from worker.linger import Listener
from worker.objects import Objects
from worker.pipeline import BatchPolicy, Decoded, Ran, Runner, Task
from worker.transform import ShardRunner
from worker.writer import BatchReport, Writer

# What callers import from here besides `Batcher`, whose homes are worker/drain.py,
# worker/pipeline.py and worker/writer.py.
__all__ = ["DRAIN", "BatchPolicy", "BatchReport", "Batcher", "Drain", "drain_bound_s"]

log = logging.getLogger(__name__)

# Batches a message may run beyond those its named jobs fill (see `Batcher.run`).
MAX_EXTRA_BATCHES = 4
# How long one message may keep starting batches before it hands its named jobs still queued to a
# new message and ends: the child then takes its next message, so a wake-up that goes first (a
# dead child's jobs, PRIORITY_RETRY) waits about this long even behind a message that names
# thousands of jobs.
TASK_BUDGET_S = 1.0


def _no_wake(model: str, version: int, job_ids: Sequence[str]) -> None:
    """Without a publisher, jobs handed back wait for their message or the sweeper."""


def _no_busy(model: str, version: int, seconds: float) -> None:
    """Without a meter, the device's busy time is only counted in the metrics."""


def _no_peers(model: str, version: int) -> int:
    """Without presence, this child is taken to serve the model alone: nothing is split."""
    return 0


@dataclass
class Batcher:
    """Runs batches for one child: its sessions, its identity, how to tell the API a job ended.

    Three stages in three threads, handing one batch at a time to the next, so the device
    never waits on the database or on decoding: the feeder claims and decodes batch k+1 while
    the task's thread runs batch k on the device, and the writer encodes, writes and announces
    batch k-1. The heartbeat keeps every lease the child holds alive, in whichever stage, from
    its claim until its batch is written or handed back.

    Time limit: a batch whose forward passes run past `policy.timeout_s` is ended by the heartbeat
    thread (worker/timeouts.py), which then calls `on_timeout`: it ends the process, whose stuck
    forward pass holds the device.

    A task reads the fields below afresh (its stages get them when it starts), so a test may
    replace one between tasks.
    """

    sessions: sessionmaker[Session]
    owner: str
    lease_s: float
    # Announces ended jobs (after their commit): ids, or whole jobs (worker/announcer.py).
    notify: Notify
    # Publishes a wake-up for jobs handed back to the queue: (model, version, job ids).
    wake: Wake = _no_wake
    # The same for fresh jobs, none pushed while one for the version waits already.
    wake_once: Wake = _no_wake
    # Called once a timed-out batch's jobs are dealt with; tests record instead of exiting.
    on_timeout: Callable[[], None] = timeouts.end_process
    # Whether the worker is shutting down: then claim nothing more (worker/drain.py).
    draining: Callable[[], bool] = DRAIN.began
    # The device, as metrics name it (the seconds its forward passes took).
    device: str = ""
    # How many other live children serve a model version: a job larger than a batch is split
    # into parts for them (db/parts.py) when they have nothing else queued to run.
    peers: Callable[[str, int], int] = _no_peers
    # Counts each batch's device seconds for the child's reported busy share (worker/busy.py).
    on_busy: Callable[[str, int, float], None] = _no_busy
    # The object store: inputs held there, outputs too large for a row (worker/objects.py).
    objects: Objects | None = None
    # Where transforms may read and write (tffleet.datasets.locations; None: get_settings()).
    settings: Settings | None = None
    # Reads that take no lock (`db.engine.readonly`: on SQLite, no BEGIN IMMEDIATE, whose write
    # lock a submission's insert would wait for); None: `sessions`.
    reads: sessionmaker[Session] | None = None
    # Hears of fresh jobs of a task's version while its queue is dry, for the task to run them
    # instead of ending (worker/linger.py); None: a task ends when its queue is dry.
    listener: Listener | None = None
    _heartbeat: Heartbeat = field(init=False, repr=False)
    _feeder_thread: ThreadPoolExecutor = field(init=False, repr=False)
    _writer_thread: ThreadPoolExecutor = field(init=False, repr=False)
    # Whether the last batch found other jobs waiting, from one task to the next (`Feeder`).
    _queue_busy: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self._heartbeat = Heartbeat(
            sessions=self.sessions, lease_s=self.lease_s, on_deadline=self._time_out
        )
        self._feeder_thread = ThreadPoolExecutor(1, thread_name_prefix="batch-feeder")
        self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="batch-writer")

    def run(
        self,
        *,
        model: str,
        version: int,
        job_ids: Sequence[str],
        runner: Runner,
        policy: BatchPolicy,
        task_id: str | None = None,
    ) -> BatchReport:
        """Run batches of this model version until the jobs the message names have left the
        queue. Each batch takes what the database says runs next (the waiting tenants in turn,
        then priority, then age), not first the named jobs: a message is a hint that work waits,
        so a tenant's one job, or a priority-10 job, never waits behind thousands of jobs that
        other messages named.

        While the queue is busy, a task goes on beyond its named jobs with whatever waits. A
        message runs at most `MAX_EXTRA_BATCHES` batches more than its named jobs fill, and
        starts none after `TASK_BUDGET_S`; named jobs still queued then are published again
        (`handoff.pass_on`: split in two while they fill more than a batch, so one bulk request
        spreads over every idle child within a few seconds), and the task ends. A task that
        ends without a last claim looking at the queue publishes a wake-up for the fresh jobs
        still waiting, unless one waits in the broker already (`handoff.keep_awake`): a child
        never idles beside a backlog for want of a message, and a submission whose wake-up was
        left out for this task's message is never stranded. A
        task about to run a transform's shard (seconds alone on its device) passes its named jobs
        still queued on first (`handoff.before_shard`), so the other shards run beside it.

        A named job that was claimed before and did not end (its worker died, its batch timed
        out) may be what killed that batch: it runs alone, after the others, so a job that
        crashes its child takes no other job with it.

        Once the worker is shutting down (`draining`), no batch starts: the named jobs still
        queued are published again, for another worker, and the task ends.

        Every batch is written before the task returns. Raises `INFRA_ERRORS` when the database
        fails; the leases held are handed back first where the database still answers.
        """
        # A job's `worker` names the task that ran it: in Flower, /task/<id> is its batch.
        worker = f"{self.owner} task {task_id}" if task_id else self.owner
        task = Task(model=model, version=version, runner=runner, policy=policy, worker=worker)
        named = list(dict.fromkeys(job_ids))
        if not self.draining():
            named = handoff.share(named, task=task, peers=self.peers, wake=self.wake)
        batches = -(-max(len(named), 1) // policy.max_batch_size) + MAX_EXTRA_BATCHES
        budget_ends = time.monotonic() + TASK_BUDGET_S
        feeder, writer = self._feeder(task, named), self._writer(task)
        pending: Future[Next] | None = None
        try:
            following = feeder.next(after=None, claim=True)
            started = 0
            while following.batch is not None:
                batch = following.batch
                started += 1
                after = [lease.job_id for lease in [*batch.leases, *batch.shards]]
                if batch.shards and named:  # the rest of the message goes to other children
                    named = feeder.named = handoff.before_shard(
                        named, running=after, task=task, sessions=self.sessions,
                        peers=self.peers, wake=self.wake,
                    )  # fmt: skip
                # Shards first, alone, before the next claim: a child holds one at a time.
                writer.report.add(self._run_shards(task, batch.shards))
                more = started < batches and time.monotonic() < budget_ends
                pending = self._feeder_thread.submit(feeder.next, after=after, claim=more)
                if batch.leases:
                    writer.submit(self._forward(task, batch))
                following, pending = pending.result(), None
                # A batch heard of at the dry queue's end is no extra batch of this message's:
                # the task goes on with those while its budget of time lasts.
                batches += following.heard
                if following.batch is not None and self.draining():
                    drain.put_back(
                        following.batch.leases, task=task, named=named, sessions=self.sessions,
                        heartbeat=self._heartbeat, wake=self.wake,
                    )  # fmt: skip
                    following = replace(following, batch=None, draining=True)
            writer.wait()
        except BaseException:
            self._abandon(task, writer, pending)
            raise
        finally:
            self._queue_busy = feeder.queue_busy
        report = writer.report
        if following.draining:
            drain.leave(named, task=task, sessions=self._reads, wake=self.wake)
            self._keep_awake(task)  # for another worker
            return report
        # Named jobs still queued: the task ran out of batches or time, or its claim found them
        # locked by another child's claim (on PostgreSQL a claim skips the rows another one
        # holds for a moment, all of its candidates though it takes one shard): never dropped.
        if following.fresh:
            handoff.pass_on(following.fresh, task=task, wake=self.wake)
        elif following.stopped:
            # No last claim looked at the queue: jobs whose submissions counted on this task's
            # message to wake them may wait there (a claim that found it empty needs no check).
            self._keep_awake(task)
        report.add(self._run_retried(feeder, writer, following.retried))
        return report

    def _keep_awake(self, task: Task) -> None:
        handoff.keep_awake(
            model=task.model, version=task.version, sessions=self._reads, wake=self.wake_once
        )

    @property
    def _reads(self) -> sessionmaker[Session]:
        return self.reads or self.sessions

    def _feeder(self, task: Task, named: Sequence[str]) -> Feeder:
        return Feeder(
            task=task, named=named, sessions=self.sessions, reads=self._reads, owner=self.owner,
            lease_s=self.lease_s, heartbeat=self._heartbeat, notify=self.notify, wake=self.wake,
            peers=self.peers, draining=self.draining, queue_busy=self._queue_busy,
            objects=self.objects, listener=self.listener,
        )  # fmt: skip

    def _writer(self, task: Task) -> Writer:
        return Writer(
            task=task, sessions=self.sessions, heartbeat=self._heartbeat, notify=self.notify,
            wake=self.wake, thread=self._writer_thread, objects=self.objects,
        )  # fmt: skip

    def _forward(self, task: Task, batch: Decoded) -> Ran:
        """The device's stage, in the task's thread."""
        started = time.perf_counter()
        with self._heartbeat.hold(
            model=task.model, version=task.version, leases=batch.leases,
            timeout_s=task.policy.timeout_s,
        ):  # fmt: skip
            ran = pipeline.forward(batch, runner=task.runner, policy=task.policy)
        metrics.BATCH_SECONDS.labels(task.model).observe(time.perf_counter() - started)
        metrics.DEVICE_BUSY_SECONDS.labels(self.device, task.model).inc(ran.busy_s)
        self.on_busy(task.model, task.version, ran.busy_s)
        return ran

    def _run_retried(self, feeder: Feeder, writer: Writer, retried: list[str]) -> BatchReport:
        """Run the named jobs claimed before, one forward pass each, one stage after another."""
        task = feeder.task
        report = BatchReport()
        while retried:
            if self.draining():
                drain.leave(retried, task=task, sessions=self._reads, wake=self.wake)
                break
            lease, canceled = feeder.claim_retried(retried)
            if lease is None:
                if not canceled:
                    break
                # The oldest was past its deadline: the others may still run.
                retried = [job_id for job_id in retried if job_id not in canceled]
                continue
            retried.remove(lease.job_id)
            decoded = feeder.hold([lease])
            report.add(self._run_shards(task, decoded.shards))
            if decoded.leases:
                report.add(writer.write(self._forward(task, decoded)))
        return report

    def _run_shards(self, task: Task, shards: Sequence[Lease]) -> BatchReport:
        """Run a batch's transform shards, one after another (worker/transform.py)."""
        report = BatchReport()
        if not shards:
            return report

        def busy(seconds: float) -> None:
            metrics.DEVICE_BUSY_SECONDS.labels(self.device, task.model).inc(seconds)
            self.on_busy(task.model, task.version, seconds)

        runner = ShardRunner(
            task=task, sessions=self.sessions, heartbeat=self._heartbeat, notify=self.notify,
            wake=self.wake, lease_s=self.lease_s, draining=self.draining, settings=self.settings,
            on_busy=busy,
        )  # fmt: skip
        for lease in shards:
            report.add(runner.run(lease))
        return report

    def _abandon(self, task: Task, writer: Writer, pending: Future[Next] | None) -> None:
        """The task failed: let the stages settle, then hand back every lease still held."""
        # Their own errors are dropped: the task's is the one raised.
        with contextlib.suppress(BaseException):
            writer.wait()
        if pending is not None:
            with contextlib.suppress(BaseException):
                pending.result()
        handoff.hand_back(
            self._heartbeat.kept(), task=task, sessions=self.sessions, heartbeat=self._heartbeat,
            wake=self.wake,
        )  # fmt: skip

    def fail_named(
        self, *, model: str, version: int, job_ids: Sequence[str], message: str
    ) -> BatchReport:
        """End the named jobs still queued `failed`/`model_error` (this child cannot run them)."""
        canceled: list[str] = []
        with self.sessions.begin() as session:
            leases = jobs.claim(
                session=session,
                job_ids=job_ids,
                owner=self.owner,
                lease_s=self.lease_s,
                canceled=canceled,
            )
            jobs.fail(
                session=session, leases=leases, code=JobErrorCode.MODEL_ERROR, message=message
            )
        metrics.JOBS_FINISHED.labels(model, "failed").inc(len(leases))
        self.notify([lease.job_id for lease in leases] + canceled)
        return BatchReport(claimed=len(leases), failed=len(leases), written=len(leases))

    def _time_out(self, batch: Running) -> None:
        """The heartbeat calls it, while the batch cannot finish (worker/timeouts.py)."""
        timeouts.end_batch(batch, sessions=self.sessions, notify=self.notify, wake=self.wake)
        self.on_timeout()
