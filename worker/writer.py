"""The writer's stage of a child's pipeline: encode a batch's outputs, write them under their
leases in one transaction, and announce the jobs that ended.

An output too large for a row goes to the object store first, as a whole .npy that the row
references (worker/objects.py); the job is marked as owning objects before any is written.
A database error hands the batch's leases back and raises, for the task to retry; a store that
does not take an output puts that job back, unstarted as far as its attempts go, and raises
once the others are written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, parts, usage
from db.jobs import Lease
from db.models import JobErrorCode
from tffleet.announcements import MAX_INLINE_OUTPUTS_BYTES, EndedJob
from tffleet.objectstore import StoreUnavailable
from worker import handoff, metrics, objects, pipeline
from worker.announcer import Notify
from worker.handoff import Wake
from worker.heartbeat import Heartbeat
from worker.objects import Objects, Written
from worker.pipeline import Failure, Ran, Task
from worker.retry import INFRA_ERRORS


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


@dataclass
class Writer:
    """Writes the batches of one task. `submit` hands a batch to the writer's thread, one at a
    time, in order: a failed write's error reaches the task's thread at the next `submit` or at
    `wait`. `report` sums the batches written through them."""

    task: Task
    sessions: sessionmaker[Session]
    heartbeat: Heartbeat
    notify: Notify
    wake: Wake
    thread: ThreadPoolExecutor
    # The child's object store, for outputs too large for a row (None: every output inline).
    objects: Objects | None = None
    report: BatchReport = field(default_factory=BatchReport)
    _pending: Future[BatchReport] | None = field(default=None, init=False, repr=False)

    def submit(self, ran: Ran) -> None:
        self.wait()
        self._pending = self.thread.submit(self.write, ran)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self.report.add(pending.result())

    def write(self, ran: Ran) -> BatchReport:
        """Write large outputs to the store, encode, write in one transaction, announce."""
        model, version, leases = self.task.model, self.task.version, ran.leases
        report = BatchReport(claimed=len(leases), samples=sum(lease.samples for lease in leases))
        try:
            stored, skipped = self._store(ran)
            outcomes = pipeline.encode(ran, references=stored.references)
            outcomes = [(lease, out) for lease, out in outcomes if lease.job_id not in skipped]
            succeeded = [(lease, out) for lease, out in outcomes if isinstance(out, bytes)]
            failed = [(lease, out) for lease, out in outcomes if not isinstance(out, bytes)]
            spent = ran.device_s
            with self.sessions.begin() as session:
                finished_at = clock.now(session)
                report.written = jobs.complete(
                    session=session, results=succeeded, now=finished_at, stored=stored.sizes,
                    device_s=spent,
                )  # fmt: skip
                whole = report.written == len(succeeded)
                for lease, failure in failed:
                    code, message = _code_and_message(failure)
                    report.written += jobs.fail(
                        session=session, leases=[lease], code=code, message=message,
                        device_s=spent,
                    )  # fmt: skip
                if stored.unwritten:
                    jobs.unclaim(
                        session=session,
                        leases=stored.unwritten,
                        reason=f"the object store did not take its outputs ({stored.error})",
                    )
                # Split jobs whose last part this was end now, in the same transaction.
                joined = parts.settle(
                    session=session, parent_ids=parents(leases), spill=self._spill()
                )
                cost = costs(model, leases, spent, skipped=skipped, finished_at=finished_at)
                usage.record(session, cost, at=finished_at)
        except INFRA_ERRORS:
            handoff.hand_back(
                leases, task=self.task, sessions=self.sessions, heartbeat=self.heartbeat,
                wake=self.wake,
            )  # fmt: skip
            raise
        except StoreUnavailable as exc:  # a split job's join could not write its outputs
            objects.put_back(leases, sessions=self.sessions, heartbeat=self.heartbeat, error=exc)
            raise
        self.heartbeat.drop(leases)
        report.succeeded, report.failed = len(succeeded), len(failed)
        metrics.JOBS_FINISHED.labels(model, "succeeded").inc(report.succeeded)
        metrics.JOBS_FINISHED.labels(model, "failed").inc(report.failed)
        for tenant, tally in cost.by_tenant.items():
            metrics.DEVICE_SECONDS.labels(tenant, model).inc(tally.device_s)
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
                    worker=self.task.worker or lease.owner,
                    outputs=outputs,
                    deadline_at=lease.deadline_at,
                    queue_timeout_at=lease.queue_timeout_at,
                    samples=lease.samples,
                    device_s=spent.get(lease.job_id, 0.0),
                )
            )
        self.notify([*ended, *joined])
        if stored.error is not None:
            raise stored.error  # the task tries again later, as after a lost database
        return report

    def _spill(self) -> parts.Spill | None:
        """Where a split job's joined outputs too large for a row go (db/parts.py)."""
        if self.objects is None:
            return None
        return parts.Spill(self.objects.store, self.objects.inline_max_bytes)

    def _store(self, ran: Ran) -> tuple[Written, set[str]]:
        """Write the outputs too large for a row to the store, each job marked as owning
        objects first (`reserve_storage`, its own transaction: committed before any write).
        Returns what was written, and the jobs not to complete now: those whose lease no
        longer held (their result would be fenced out) and those the store did not take."""
        if self.objects is None:
            return Written(), set()
        big = self.objects.too_big(ran.outputs)
        if not big:
            return Written(), set()
        with self.sessions.begin() as session:
            held = {lease.job_id for lease in jobs.reserve_storage(session=session, leases=big)}
        written = self.objects.write(
            [(lease, out) for lease, out in ran.outputs if lease.job_id in held]
        )
        lost = {lease.job_id for lease in big if lease.job_id not in held}
        return written, lost | {lease.job_id for lease in written.unwritten}


def _code_and_message(failure: str | Failure) -> tuple[JobErrorCode, str]:
    if isinstance(failure, Failure):
        return failure.code, failure.message
    return JobErrorCode.MODEL_ERROR, failure


def costs(
    model: str,
    leases: Sequence[Lease],
    device_s: Mapping[str, float],
    *,
    skipped: Set[str],
    finished_at: datetime,
) -> usage.Batch:
    """What a written batch cost, by tenant (db/usage.py): every job's device seconds (the
    device spent them, whatever came of the job); a job that ended here counts once, with its
    samples and its time queued and running; a split job's part, its samples only (the job
    counts when it ends); a job not written (`skipped`: its lease was lost, or the store did not
    take its outputs), only its device seconds."""
    batch = usage.Batch(model)
    for lease in leases:
        done = lease.job_id not in skipped
        whole = done and lease.parent_id is None
        batch.add(
            lease.tenant,
            ended=whole,
            samples=lease.samples if done else 0,
            device_s=device_s.get(lease.job_id, 0.0),
            queue_s=usage.seconds(lease.created_at, lease.started_at) if whole else 0.0,
            run_s=usage.seconds(lease.started_at, finished_at) if whole else 0.0,
        )
    return batch


def parents(leases: Sequence[Lease]) -> set[str]:
    """The split jobs these leases hold parts of."""
    return {lease.parent_id for lease in leases if lease.parent_id is not None}
