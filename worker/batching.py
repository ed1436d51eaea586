"""One batch: claim the named jobs, top up with other queued jobs, run one forward pass, write.

A job that was claimed before and did not end (its child died, its batch ran out of time) runs
alone from then on. A forward pass that outlives the model's time limit is ended by the heartbeat
thread, which then ends the child (see `Batcher`). A database error hands the leases back and
raises, for the task to retry (worker/retry.py maps every path by which a job runs again).
Once the worker's warm shutdown began (`DRAIN`), a child ends the batch it holds and claims no
more, so the worker exits within `drain_bound_s` of SIGTERM.

Plain logic over a `Runner` (anything with `inputs` and `run(batch) -> outputs`), so tests can pass
a function instead of TensorFlow.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs
from db.jobs import Lease
from db.models import JobErrorCode
from tffleet import tensors
from tffleet.announcements import MAX_INLINE_OUTPUTS_BYTES, EndedJob
from worker import metrics
from worker.heartbeat import Heartbeat, Running
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


class Runner(Protocol):
    inputs: dict[str, dict[str, Any]]

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int
    max_queue_delay_ms: float
    buckets: tuple[int, ...]
    # How long one batch's forward passes may run (None: no limit); see `Batcher`.
    timeout_s: float | None = None

    def padded_size(self, samples: int) -> int:
        """The smallest bucket that holds `samples`, so shapes repeat and nothing retraces."""
        for size in self.buckets:
            if size >= samples:
                return size
        return samples


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


@dataclass
class Batcher:
    """Runs batches for one child: its sessions, its identity, how to tell the API a job ended.

    Time limit: a batch whose forward passes run past `policy.timeout_s` is ended by the heartbeat
    thread. A lone job fails `timeout`; the jobs of a larger batch go back to the queue, where
    each then runs alone (they were claimed before), so only the slow one fails. Then the thread
    calls `on_timeout`, which ends the process (the stuck forward pass holds the device).
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
    _heartbeat: Heartbeat = field(init=False, repr=False)
    # Whether the last batch found other jobs waiting: only then is waiting for more worth it.
    _queue_busy: bool = field(default=False, init=False, repr=False)
    # What the jobs' `worker` says: this child, and the Celery task running them (`run`).
    _worker: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        self._heartbeat = Heartbeat(
            sessions=self.sessions, lease_s=self.lease_s, on_deadline=self._time_out
        )

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

        A message runs at most `MAX_EXTRA_BATCHES` batches more than its named jobs fill, and
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

        Raises `INFRA_ERRORS` when the database fails; the leases held are handed back first
        where the database still answers.
        """
        report = BatchReport()
        # A job's `worker` names the task that ran it: in Flower, /task/<id> is its batch.
        self._worker = f"{self.owner} task {task_id}" if task_id else self.owner
        named = list(dict.fromkeys(job_ids))
        fresh: list[str] = []
        retried: list[str] = []
        claimed: set[str] = set()
        batches = -(-max(len(named), 1) // policy.max_batch_size) + MAX_EXTRA_BATCHES
        budget_ends = time.monotonic() + TASK_BUDGET_S
        for _ in range(batches):
            if self.draining():
                self._leave(model, version, named)
                return report
            claimed = self._run_batch(
                report, model=model, version=version, runner=runner, policy=policy
            )
            if claimed >= set(named):
                fresh, retried = [], []
                break
            with self.sessions() as session:
                fresh, retried = jobs.still_queued(session=session, job_ids=named)
            if not fresh or not claimed or time.monotonic() >= budget_ends:
                break
        if fresh and claimed:  # out of batches or time with named jobs still waiting
            self._pass_on(model, version, fresh, policy)
        elif claimed and self._queue_busy and not self.draining():
            self._keep_awake(model, version, policy)
        while retried:
            if self.draining():
                self._leave(model, version, retried)
                break
            with self.sessions.begin() as session:
                lease = jobs.claim_retried(
                    session=session,
                    job_ids=retried,
                    owner=self.owner,
                    lease_s=self.lease_s,
                    worker=self._worker,
                )
            if lease is None:
                break
            retried.remove(lease.job_id)
            report.add(
                self._run_leases(
                    model=model, version=version, leases=[lease], runner=runner, policy=policy
                )
            )
        return report

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

    def _run_batch(
        self,
        report: BatchReport,
        *,
        model: str,
        version: int,
        runner: Runner,
        policy: BatchPolicy,
    ) -> set[str]:
        """Claim and run one batch, adding to `report`; returns the ids it claimed."""
        leases: list[Lease] = []
        try:
            self._claim(leases, model=model, version=version, policy=policy)
        except INFRA_ERRORS:
            self._hand_back(model, version, leases)
            raise
        if leases:
            report.add(
                self._run_leases(
                    model=model, version=version, leases=leases, runner=runner, policy=policy
                )
            )
        return {lease.job_id for lease in leases}

    def _run_leases(
        self,
        *,
        model: str,
        version: int,
        leases: list[Lease],
        runner: Runner,
        policy: BatchPolicy,
    ) -> BatchReport:
        report = BatchReport(claimed=len(leases), samples=sum(lease.samples for lease in leases))
        _observe_claim(model, leases)
        started = time.perf_counter()
        with self._heartbeat.hold(
            model=model, version=version, leases=leases, timeout_s=policy.timeout_s
        ):
            outcomes = run_leases(leases, runner=runner, policy=policy)
        metrics.BATCH_SECONDS.labels(model).observe(time.perf_counter() - started)
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
        except INFRA_ERRORS:
            self._hand_back(model, version, leases)
            raise
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
                )
            )
        self.notify(ended)
        return report

    def fail_named(
        self, *, model: str, version: int, job_ids: Sequence[str], message: str
    ) -> BatchReport:
        """End the named jobs still queued `failed`/`model_error` (this child cannot run them)."""
        with self.sessions.begin() as session:
            leases = jobs.claim(
                session=session, job_ids=job_ids, owner=self.owner, lease_s=self.lease_s
            )
            jobs.fail(
                session=session, leases=leases, code=JobErrorCode.MODEL_ERROR, message=message
            )
        metrics.JOBS_FINISHED.labels(model, "failed").inc(len(leases))
        self.notify([lease.job_id for lease in leases])
        return BatchReport(claimed=len(leases), failed=len(leases), written=len(leases))

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
        with self.sessions.begin() as session:
            claimed = self._top_up(session, model, version, leases, policy)
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
            with self.sessions.begin() as session:
                more = self._top_up(session, model, version, leases, policy)
        self._queue_busy = topped_up

    def _top_up(
        self,
        session: Session,
        model: str,
        version: int,
        leases: Sequence[Lease],
        policy: BatchPolicy,
    ) -> list[Lease]:
        room = policy.max_batch_size - sum(lease.samples for lease in leases)
        if room <= 0:
            return []
        return jobs.claim_next_fresh(
            session=session,
            model=model,
            version=version,
            owner=self.owner,
            lease_s=self.lease_s,
            max_samples=room,
            take_oversized=not leases,
            worker=self._worker,
        )

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


def _observe_claim(model: str, leases: Sequence[Lease]) -> None:
    metrics.BATCH_JOBS.labels(model).observe(len(leases))
    metrics.BATCH_SAMPLES.labels(model).observe(sum(lease.samples for lease in leases))
    for lease in leases:  # both times are the database's
        if lease.created_at is not None and lease.started_at is not None:
            metrics.QUEUE_WAIT_SECONDS.labels(model).observe(
                (lease.started_at - lease.created_at).total_seconds()
            )


Outcome = tuple[Lease, bytes | str]  # packed outputs, or an error message


def run_leases(leases: Sequence[Lease], *, runner: Runner, policy: BatchPolicy) -> list[Outcome]:
    """Run every claimed job: batch jobs whose shapes agree, isolate a job that makes TF raise."""
    outcomes: list[Outcome] = []
    groups: dict[tuple[Any, ...], list[tuple[Lease, dict[str, np.ndarray]]]] = {}
    for lease in leases:
        try:
            arrays = tensors.unpack(lease.inputs)
        except Exception:
            # An unreadable blob is that job's fault alone: raising here would strand the whole
            # batch until its leases expire, and cost every job in it an attempt.
            outcomes.append((lease, _describe_failure()))
            continue
        key = tuple((name, arrays[name].shape[1:]) for name in sorted(arrays))
        groups.setdefault(key, []).append((lease, arrays))
    for group in groups.values():
        try:
            outcomes.extend(_run_group(group, runner=runner, policy=policy))
        except Exception:
            if len(group) == 1:
                lease, _ = group[0]
                outcomes.append((lease, _describe_failure()))
                continue
            # One bad job must not fail the others: run each alone to find it.
            for item in group:
                try:
                    outcomes.extend(_run_group([item], runner=runner, policy=policy))
                except Exception:
                    outcomes.append((item[0], _describe_failure()))
    return outcomes


def _describe_failure() -> str:
    import sys

    exc = sys.exc_info()[1]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:1000]


def _run_group(
    group: Sequence[tuple[Lease, dict[str, np.ndarray]]], *, runner: Runner, policy: BatchPolicy
) -> list[Outcome]:
    names = list(runner.inputs)
    if len(group) == 1:  # a large job usually runs alone: no copy of its inputs
        batch = {name: group[0][1][name] for name in names}
    else:
        batch = {name: np.concatenate([arrays[name] for _, arrays in group]) for name in names}
    total = len(next(iter(batch.values())))
    outputs = _forward(batch, total=total, runner=runner, policy=policy)
    outcomes: list[Outcome] = []
    start = 0
    for lease, _ in group:
        end = start + lease.samples
        outcomes.append((lease, tensors.pack({k: v[start:end] for k, v in outputs.items()})))
        start = end
    return outcomes


def _forward(
    batch: dict[str, np.ndarray], *, total: int, runner: Runner, policy: BatchPolicy
) -> dict[str, np.ndarray]:
    """Pad to a bucket and run; a batch over max_batch_size runs in chunks, joined in order."""
    parts: list[dict[str, np.ndarray]] = []
    for start in range(0, total, policy.max_batch_size):
        chunk = {k: v[start : start + policy.max_batch_size] for k, v in batch.items()}
        size = len(next(iter(chunk.values())))
        padded = policy.padded_size(size)
        if padded > size:
            chunk = {k: _pad(v, padded - size) for k, v in chunk.items()}
        out = runner.run(chunk)
        parts.append({k: np.asarray(v)[:size] for k, v in out.items()})
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _pad(array: np.ndarray, rows: int) -> np.ndarray:
    """`array` with `rows` more of zeros, False or b"" (strings: np.zeros would put 0 there)."""
    fill = b"" if array.dtype == object else 0
    return np.concatenate([array, np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)])
