"""A child's batches: claim what runs next, run it on the device, write the results, announce.

A job that was claimed before and did not end (its child died, its batch ran out of time) runs
alone from then on. A forward pass that outlives the model's time limit is ended by the heartbeat
thread, which then ends the child (see `Batcher`). A database error hands the leases back and
raises, for the task to retry (worker/retry.py maps every path by which a job runs again).
Once the worker's warm shutdown began (`DRAIN`), a child ends the batch it holds and claims no
more, so the worker exits within `drain_bound_s` of SIGTERM.

The stages overlap, each in a thread of its own (`Batcher`; the stages are worker/pipeline.py).
Plain logic over a `Runner` (anything with `inputs` and `run(batch) -> outputs`), so tests can pass
a function instead of TensorFlow.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, parts
from db.jobs import Lease
from db.models import JobErrorCode
from tffleet.announcements import MAX_INLINE_OUTPUTS_BYTES, EndedJob
from worker import metrics, pipeline
from worker.heartbeat import Heartbeat, Running
from worker.pipeline import BatchPolicy, Decoded, Ran, Runner
from worker.retry import INFRA_ERRORS

log = logging.getLogger(__name__)

_TOP_UP_POLL_S = 0.0005
# Batches a message may run beyond those its named jobs fill (see `Batcher.run`).
MAX_EXTRA_BATCHES = 4
# How long one message may keep starting batches before it hands its named jobs still queued to a
# new message and ends: the child then takes its next message, so a wake-up that goes first (a
# dead child's jobs, PRIORITY_RETRY) waits about this long even behind a message that names
# thousands of jobs.
TASK_BUDGET_S = 1.0

# The exit status of a child that ended itself because a batch ran past its time limit.
TIMEOUT_EXIT_CODE = 75

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
    anonymous shared memory, mapped at import in the main process (Celery imports the task
    modules before it forks the pool), so every child, also one forked later to replace another,
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


@dataclass
class BatchReport:
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    samples: int = 0
    written: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def add(self, other: BatchReport) -> None:
        for name, value in other.as_dict().items():
            setattr(self, name, getattr(self, name) + value)


def _end_process() -> None:
    # A forward pass cannot be interrupted from Python, so the only way to free the device is to
    # end this process. Celery sees its child die, redelivers the message it was running
    # (task_reject_on_worker_lost), and starts a new child on the same pool index: the same device.
    os._exit(TIMEOUT_EXIT_CODE)


def _no_wake(model: str, version: int, job_ids: Sequence[str]) -> None:
    """Without a publisher, jobs handed back wait for their message or the sweeper."""


def _no_busy(model: str, version: int, seconds: float) -> None:
    """Without a meter, the device's busy time is only counted in the metrics."""


def _no_peers(model: str, version: int) -> int:
    """Without presence, this child is taken to serve the model alone: nothing is split."""
    return 0


@dataclass(frozen=True)
class _Task:
    """The model version a task runs, and how."""

    model: str
    version: int
    runner: Runner
    policy: BatchPolicy


@dataclass
class _Next:
    """What the feeder found for the device: the next batch, and what remains of the message."""

    batch: Decoded | None  # claimed and decoded; None: nothing more for this task to run
    fresh: list[str]  # the message's named jobs still queued and never claimed
    retried: list[str]  # ... and those claimed before (they run alone, last)
    # No claim was tried: the named jobs left the queue and it is not busy, or the task is out
    # of batches or time.
    stopped: bool = False
    draining: bool = False  # the worker is shutting down: nothing was claimed


class _Writes:
    """The hand-off to the writer thread: one batch at a time, in order. A failed write's error
    reaches the task's thread at the next hand-off or at `wait`."""

    def __init__(self, writer: ThreadPoolExecutor) -> None:
        self._writer = writer
        self._pending: Future[BatchReport] | None = None
        self.report = BatchReport()

    def submit(self, write: Callable[..., BatchReport], *args: object) -> None:
        self.wait()
        self._pending = self._writer.submit(write, *args)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self.report.add(pending.result())


@dataclass
class Batcher:
    """Runs batches for one child: its sessions, its identity, how to tell the API a job ended.

    Three stages in three threads, handing one batch at a time to the next, so the device
    never waits on the database or on decoding: the feeder claims and decodes batch k+1 while
    the task's thread runs batch k on the device, and the writer encodes, writes and announces
    batch k-1 (worker/pipeline.py has the stages). The heartbeat keeps every lease the child
    holds alive, in whichever stage, from its claim until its batch is written or handed back.

    Time limit: a batch whose forward passes run past `policy.timeout_s` is ended by the heartbeat
    thread. A lone job fails `timeout`; the jobs of a larger batch go back to the queue, where
    each then runs alone (they were claimed before), so only the slow one fails. Then the thread
    calls `on_timeout`, which ends the process (the stuck forward pass holds the device); the
    worker's main process takes back the batches the child held in its other stages
    (worker/orphans.py).
    """

    sessions: sessionmaker[Session]
    owner: str
    lease_s: float
    # Announces ended jobs (after their commit): ids, or whole jobs (tffleet.announcements).
    notify: Callable[[Sequence[str | EndedJob]], None]
    # Publishes a wake-up for jobs handed back to the queue: (model, version, job ids).
    wake: Callable[[str, int, Sequence[str]], object] = _no_wake
    # Called once a timed-out batch's jobs are dealt with; tests record instead of exiting.
    on_timeout: Callable[[], None] = _end_process
    # Whether the worker is shutting down: then claim nothing more (see `Drain`).
    draining: Callable[[], bool] = DRAIN.began
    # The device, as metrics name it (the seconds its forward passes took).
    device: str = ""
    # How many other live children serve a model version: a job larger than a batch is split
    # into parts for them (db/parts.py) when they have nothing else queued to run.
    peers: Callable[[str, int], int] = _no_peers
    # Counts each batch's device seconds for the child's reported busy share (worker/busy.py).
    on_busy: Callable[[str, int, float], None] = _no_busy
    _heartbeat: Heartbeat = field(init=False, repr=False)
    _feeder: ThreadPoolExecutor = field(init=False, repr=False)
    _writer: ThreadPoolExecutor = field(init=False, repr=False)
    # Whether the last batch found other jobs waiting: only then is waiting for more worth it.
    _queue_busy: bool = field(default=False, init=False, repr=False)
    # What the jobs' `worker` says: this child, and the Celery task running them (`run`).
    _worker: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        self._heartbeat = Heartbeat(
            sessions=self.sessions, lease_s=self.lease_s, on_deadline=self._time_out
        )
        self._feeder = ThreadPoolExecutor(1, thread_name_prefix="batch-feeder")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="batch-writer")

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
        (`_pass_on`: split in two while they fill more than a batch, so one bulk request spreads
        over every idle child within a few seconds), and the task ends. A task whose named jobs
        went to other children while more wait publishes a wake-up for those (`_keep_awake`):
        a child never idles beside a backlog for want of a message.

        A named job that was claimed before and did not end (its worker died, its batch timed
        out) may be what killed that batch: it runs alone, after the others, so a job that
        crashes its child takes no other job with it.

        Once the worker is shutting down (`draining`), no batch starts: the named jobs still
        queued are published again, for another worker, and the task ends.

        Every batch is written before the task returns. Raises `INFRA_ERRORS` when the database
        fails; the leases held are handed back first where the database still answers.
        """
        # A job's `worker` names the task that ran it: in Flower, /task/<id> is its batch.
        self._worker = f"{self.owner} task {task_id}" if task_id else self.owner
        task = _Task(model=model, version=version, runner=runner, policy=policy)
        named = self._share(task, list(dict.fromkeys(job_ids)))
        batches = -(-max(len(named), 1) // policy.max_batch_size) + MAX_EXTRA_BATCHES
        budget_ends = time.monotonic() + TASK_BUDGET_S
        writes = _Writes(self._writer)
        pending: Future[_Next] | None = None
        try:
            following = self._next(task, named, after=None, claim=True)
            started = 0
            while following.batch is not None:
                batch = following.batch
                started += 1
                more = started < batches and time.monotonic() < budget_ends
                after = [lease.job_id for lease in batch.leases]
                pending = self._feeder.submit(self._next, task, named, after=after, claim=more)
                ran = self._forward(task, batch)
                writes.submit(self._write, task, ran)
                following, pending = pending.result(), None
                if following.batch is not None and self.draining():
                    following = self._put_back(task, named, following)
            writes.wait()
        except BaseException:
            self._abandon(task, writes, pending)
            raise
        report = writes.report
        if following.draining:
            self._leave(model, version, named)
            return report
        if following.stopped and following.fresh:  # out of batches or time
            self._pass_on(model, version, following.fresh, policy)
        elif following.stopped and self._queue_busy and not self.draining():
            self._keep_awake(model, version, policy)
        report.add(self._run_retried(task, following.retried))
        return report

    def _share(self, task: _Task, named: list[str]) -> list[str]:
        """A message naming more jobs than one batch holds is shared at once with the other
        children serving the model: each gets a message naming a share, this task keeps one.
        Otherwise a fast model's bulk request runs whole on the child that took its message,
        batch after batch within `TASK_BUDGET_S`, while the others idle."""
        batches = -(-len(named) // task.policy.max_batch_size)
        if batches < 2 or self.draining():
            return named
        shares = min(self.peers(task.model, task.version), batches - 1) + 1
        for share in range(1, shares):
            self.wake(task.model, task.version, named[share::shares])
        return named[::shares]

    def _next(
        self, task: _Task, named: Sequence[str], *, after: Sequence[str] | None, claim: bool
    ) -> _Next:
        """The feeder's stage: claim and decode the task's next batch while the jobs the
        message named wait, or while the queue is busy (`after`: the ids of the batch on the
        device; None before the first). Under a steady stream of small jobs, whose messages
        each name one, a task then runs batches back to back, the pipeline full, instead of one
        batch and a Celery task's turnover per message."""
        fresh: list[str] = list(named)
        retried: list[str] = []
        if after is not None:
            if set(after) >= set(named):
                fresh = []
            else:
                with self.sessions() as session:
                    fresh, retried = jobs.still_queued(session=session, job_ids=named)
            if not claim or not (fresh or self._queue_busy):
                return _Next(batch=None, fresh=fresh, retried=retried, stopped=True)
        if self.draining():
            return _Next(batch=None, fresh=fresh, retried=retried, draining=True)
        batch = self._claim_batch(task)
        if batch is None and after is None:
            with self.sessions() as session:
                fresh, retried = jobs.still_queued(session=session, job_ids=named)
        return _Next(batch=batch, fresh=fresh, retried=retried)

    def _claim_batch(self, task: _Task) -> Decoded | None:
        leases: list[Lease] = []
        try:
            self._claim(leases, model=task.model, version=task.version, policy=task.policy)
            if self._split(task, leases):
                self._claim(leases, model=task.model, version=task.version, policy=task.policy)
        except INFRA_ERRORS:
            self._hand_back(task.model, task.version, leases)
            raise
        if not leases:
            return None
        return self._hold(task, leases)

    def _split(self, task: _Task, leases: list[Lease]) -> bool:
        """Split a job larger than a batch into parts that idle children run beside this one,
        and wake them; `leases` is emptied, for this child to claim the first part. A job is
        split only while other children serve its model and nothing else of it is queued:
        otherwise they have work of their own, and the split would only cost a copy."""
        size = task.policy.max_batch_size
        if len(leases) != 1 or leases[0].samples <= size:
            return False
        peers = self.peers(task.model, task.version)
        if peers <= 0:
            return False
        with self.sessions() as session:
            if jobs.some_queued(session=session, model=task.model, version=task.version, limit=1):
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

    def _hold(self, task: _Task, leases: list[Lease]) -> Decoded:
        """Keep claimed leases alive from now until their batch is written, and decode them."""
        self._heartbeat.keep(leases)
        _observe_claim(task.model, leases)
        return pipeline.decode(leases, runner=task.runner)

    def _forward(self, task: _Task, batch: Decoded) -> Ran:
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

    def _write(self, task: _Task, ran: Ran) -> BatchReport:
        """The writer's stage: encode, write in one transaction, announce."""
        model, version, leases = task.model, task.version, ran.leases
        report = BatchReport(claimed=len(leases), samples=sum(lease.samples for lease in leases))
        outcomes = pipeline.encode(ran)
        succeeded = [(lease, out) for lease, out in outcomes if isinstance(out, bytes)]
        failed = [(lease, out) for lease, out in outcomes if isinstance(out, str)]
        try:
            with self.sessions.begin() as session:
                finished_at = clock.now(session)
                report.written = jobs.complete(session=session, results=succeeded, now=finished_at)
                whole = report.written == len(succeeded)
                for lease, message in failed:
                    report.written += jobs.fail(
                        session=session,
                        leases=[lease],
                        code=JobErrorCode.MODEL_ERROR,
                        message=message,
                    )
                # Split jobs whose last part this was end now, in the same transaction.
                joined = parts.settle(session=session, parent_ids=_parents(leases))
        except INFRA_ERRORS:
            self._hand_back(model, version, leases)
            raise
        self._heartbeat.drop(leases)
        report.succeeded, report.failed = len(succeeded), len(failed)
        metrics.JOBS_FINISHED.labels(model, "succeeded").inc(report.succeeded)
        metrics.JOBS_FINISHED.labels(model, "failed").inc(report.failed)
        # A job is announced whole only when every result was written: a fenced-out one (its
        # lease lost) is not this worker's to describe.
        results = {lease.job_id: out for lease, out in succeeded} if whole else {}
        ended: list[str | EndedJob] = []
        budget = MAX_INLINE_OUTPUTS_BYTES
        for lease in leases:
            outputs = results.get(lease.job_id)
            if outputs is None or len(outputs) > budget:
                ended.append(lease.job_id)
                continue
            budget -= len(outputs)
            ended.append(
                EndedJob(
                    id=lease.job_id,
                    model=model,
                    version=version,
                    priority=lease.priority,
                    created_at=lease.created_at,
                    started_at=lease.started_at,
                    finished_at=finished_at,
                    attempts=lease.attempt,
                    worker=self._worker or lease.owner,
                    outputs=outputs,
                    deadline_at=lease.deadline_at,
                )
            )
        self.notify([*ended, *joined])
        return report

    def _run_retried(self, task: _Task, retried: list[str]) -> BatchReport:
        """Run the named jobs claimed before, one forward pass each, one stage after another."""
        report = BatchReport()
        while retried:
            if self.draining():
                self._leave(task.model, task.version, retried)
                break
            canceled: list[str] = []
            with self.sessions.begin() as session:
                lease = jobs.claim_retried(
                    session=session,
                    job_ids=retried,
                    owner=self.owner,
                    lease_s=self.lease_s,
                    worker=self._worker,
                    canceled=canceled,
                )
            self._announce_canceled(canceled)
            if lease is None:
                if not canceled:
                    break
                # The oldest was past its deadline: the others may still run.
                retried = [job_id for job_id in retried if job_id not in canceled]
                continue
            retried.remove(lease.job_id)
            ran = self._forward(task, self._hold(task, [lease]))
            report.add(self._write(task, ran))
        return report

    def _abandon(self, task: _Task, writes: _Writes, pending: Future[_Next] | None) -> None:
        """The task failed: let the stages settle, then hand back every lease still held."""
        # Their own errors are dropped: the task's is the one raised.
        with contextlib.suppress(BaseException):
            writes.wait()
        if pending is not None:
            with contextlib.suppress(BaseException):
                pending.result()
        self._hand_back(task.model, task.version, self._heartbeat.kept())

    def _pass_on(self, model: str, version: int, fresh: Sequence[str], policy: BatchPolicy) -> None:
        if len(fresh) <= policy.max_batch_size:
            self.wake(model, version, fresh)
            return
        # Two messages: another child takes half. Each split halves what a message names, so a
        # request of n jobs makes at most 2n / max_batch_size messages in all.
        half = len(fresh) // 2
        self.wake(model, version, fresh[:half])
        self.wake(model, version, fresh[half:])

    def _keep_awake(self, model: str, version: int, policy: BatchPolicy) -> None:
        # One message out for the one this task consumed: the count of messages never grows.
        with self.sessions() as session:
            waiting = jobs.some_queued(
                session=session, model=model, version=version, limit=policy.max_batch_size
            )
        if waiting:
            self.wake(model, version, waiting)

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

    def _put_back(self, task: _Task, named: Sequence[str], following: _Next) -> _Next:
        """The worker began shutting down while the feeder claimed the next batch: that batch
        does not start, so the drain still ends within one batch. Its jobs go back to the queue
        as if never claimed; the named ones are left to other workers with the rest, the others
        woken here."""
        assert following.batch is not None
        leases = following.batch.leases
        self._heartbeat.drop(leases)
        with self.sessions.begin() as session:
            jobs.unclaim(session=session, leases=leases)
        keep = set(named)
        unnamed = [lease.job_id for lease in leases if lease.job_id not in keep]
        if unnamed:
            self.wake(task.model, task.version, unnamed)
        return _Next(batch=None, fresh=following.fresh, retried=following.retried, draining=True)

    def _leave(self, model: str, version: int, named: Sequence[str]) -> None:
        """Shutting down: leave the named jobs still queued to other workers, with a wake-up
        (this task's message is acknowledged when it returns)."""
        with self.sessions() as session:
            fresh, retried = jobs.still_queued(session=session, job_ids=named)
        waiting = fresh + retried
        if waiting:
            log.info(
                "shutting down: %d %s:%s jobs left queued for other workers",
                len(waiting), model, version,
            )  # fmt: skip
            self.wake(model, version, waiting)

    def _hand_back(self, model: str, version: int, leases: Sequence[Lease]) -> None:
        """Return held jobs to the queue after an infrastructure fault, if the database answers;
        if not, their leases expire and the sweeper requeues them."""
        if not leases:
            return
        self._heartbeat.drop(leases)  # kept alive no more, whether or not the release commits
        try:
            with self.sessions.begin() as session:
                released = jobs.release(session=session, leases=leases)
        except Exception as exc:
            log.warning(
                "could not hand back %d %s jobs (%s: %s); the sweeper requeues them once their "
                "leases expire",
                len(leases), model, type(exc).__name__, exc,
            )  # fmt: skip
            return
        log.warning("handed back %d %s jobs after a database error", released, model)
        self.wake(model, version, [lease.job_id for lease in leases])

    def _claim(self, leases: list[Lease], *, model: str, version: int, policy: BatchPolicy) -> None:
        """Claim into `leases` a batch of queued jobs of this model version never claimed before.

        While the queue is busy (the last top-up found jobs) it waits up to max_queue_delay_ms for
        more to arrive; at idle a lone job runs at once instead of waiting for company.
        `leases` holds what was claimed even when a later statement raises.
        """
        deadline = time.monotonic() + policy.max_queue_delay_ms / 1000
        topped_up = False
        claimed = self._top_up(model, version, leases, policy)
        # The first job is the one the wake-up was for; any more were waiting beside it.
        leases.extend(claimed[:1])
        more = claimed[1:]
        while more or (self._queue_busy and leases and time.monotonic() < deadline):
            topped_up = topped_up or bool(more)
            leases.extend(more)
            if policy.max_batch_size - sum(lease.samples for lease in leases) <= 0:
                break
            if not more:
                time.sleep(_TOP_UP_POLL_S)
            more = self._top_up(model, version, leases, policy)
        self._queue_busy = topped_up

    def _top_up(
        self, model: str, version: int, leases: Sequence[Lease], policy: BatchPolicy
    ) -> list[Lease]:
        """Claim more jobs, in a transaction of its own; announce those it canceled instead
        (past their deadline) once it commits, as the sweeper announces its deadline cancels."""
        room = policy.max_batch_size - sum(lease.samples for lease in leases)
        if room <= 0:
            return []
        canceled: list[str] = []
        with self.sessions.begin() as session:
            claimed = jobs.claim_next_fresh(
                session=session,
                model=model,
                version=version,
                owner=self.owner,
                lease_s=self.lease_s,
                max_samples=room,
                take_oversized=not leases,
                worker=self._worker,
                canceled=canceled,
            )
        self._announce_canceled(canceled)
        return claimed

    def _announce_canceled(self, canceled: Sequence[str]) -> None:
        """Jobs a committed claim canceled for their deadline: their long-polls and event
        streams hear of it now, not at their next re-read."""
        if canceled:
            self.notify(list(canceled))

    def _time_out(self, batch: Running) -> None:
        """End a batch that ran past its time limit, then call `on_timeout`. The heartbeat
        calls it while the batch cannot finish."""
        ids = batch.job_ids
        alone = len(ids) == 1
        log.error(
            "a batch of %d %s:%s jobs ran past its %gs time limit (%s); %s; ending this child, "
            "whose forward pass cannot be interrupted",
            len(ids), batch.model, batch.version, batch.timeout_s, ", ".join(ids),
            "it fails `timeout`" if alone else "they go back to the queue to run alone",
        )  # fmt: skip
        try:
            with self.sessions.begin() as session:
                if alone:
                    jobs.fail(
                        session=session,
                        leases=batch.leases,
                        code=JobErrorCode.TIMEOUT,
                        message=f"the forward pass ran past the time limit of "
                        f"{batch.timeout_s:g}s (the model's timeout_s, or TFFLEET_JOB_TIMEOUT_S)",
                    )
                    ids += parts.settle(session=session, parent_ids=_parents(batch.leases))
                else:
                    jobs.release(session=session, leases=batch.leases)
        except Exception:
            log.exception(
                "could not record the time-out; the leases expire and the sweeper takes the "
                "jobs back"
            )
        else:
            if alone:
                metrics.JOBS_FINISHED.labels(batch.model, "failed").inc()
                self.notify(ids)
            else:
                self.wake(batch.model, batch.version, ids)
        self.on_timeout()


def _parents(leases: Sequence[Lease]) -> set[str]:
    """The split jobs these leases hold parts of."""
    return {lease.parent_id for lease in leases if lease.parent_id is not None}


def _observe_claim(model: str, leases: Sequence[Lease]) -> None:
    metrics.BATCH_JOBS.labels(model).observe(len(leases))
    metrics.BATCH_SAMPLES.labels(model).observe(sum(lease.samples for lease in leases))
    for lease in leases:  # both times are the database's
        if lease.created_at is not None and lease.started_at is not None:
            metrics.QUEUE_WAIT_SECONDS.labels(model).observe(
                (lease.started_at - lease.created_at).total_seconds()
            )
