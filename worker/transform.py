"""A transform's shard, run alone by the child that claimed it (DESIGN §14).

    reader thread      batch k+1 read and made the model's inputs   (worker/transform_io.py)
    the task's thread  batch k on the device, in chunks of the model's max_batch_size, padded
    writer thread      the outputs of batch k-1 streamed into the part (whole or not at all)

A shard is a job whose inputs are a spec (worker/transform_spec.py); the feeder hands it over
unrun (worker/feeder.py) and the batcher runs it here before it claims more (worker/batching.py),
so a child holds one shard at a time and the others' shards go to other children. Its lease is
kept by the child's heartbeat from the claim on; each forward pass runs under the model's time
limit as any batch's does. Every `PROGRESS_EVERY_S`, at a batch boundary, the shard records its
`samples_done` under its lease (`db.jobs.progress`): a lease that no longer holds (the transform
was canceled, or the job taken back) stops it there, leaving no part.

A record that cannot be used (the reader's or the mapping's: a null, a wrong size, NaN) goes to
the errors file; so does one that makes the model raise (a batch that raises runs record by
record to find it); the rest of the shard goes on. Once every batch is in, the part is completed
(none where no record was good), then the errors file written (only where there were bad
records; a part or errors file an earlier attempt left that this one has not is deleted, so a
rerun never leaves a stale errors file beside its new part), then in one transaction the
job completes with its counts as outputs and they are counted into its transform
(`db.transforms.shard_finished`). Where it ends instead (worker/retry.py maps it with the rest):

- the store does not answer: the shard goes back to the queue unstarted (no attempt spent) and
  the task raises, as for any batch (`objects.put_back`);
- the database blinks: its lease is handed back and the task raises (`handoff.hand_back`);
- the worker is shutting down: it stops at a batch boundary and goes back unstarted (`drain`);
- its input file is gone: `input_missing`; a spec, location or file that cannot be read as it
  says: `invalid_input`; a model that fails every record it is given: `model_error` (never run
  again: the same shard would fail the same way).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, transforms, usage
from db.jobs import Lease
from db.models import JobErrorCode
from tffleet.datasets import writers
from tffleet.objectstore import ObjectMissing, StoreUnavailable
from tffleet.settings import Settings, get_settings
from worker import drain, handoff, metrics, objects, pipeline
from worker.announcer import Notify
from worker.handoff import Wake
from worker.heartbeat import Heartbeat
from worker.pipeline import Arrays, Task
from worker.retry import INFRA_ERRORS
from worker.transform_io import BadRecord, Fed, PartWriter, Prefetcher
from worker.transform_spec import ShardSpec, counts, read_spec
from worker.writer import BatchReport

log = logging.getLogger(__name__)

# How often a running shard records its progress and looks whether it still holds its lease.
PROGRESS_EVERY_S = 1.0


class _Stopped(Exception):
    """The shard stops at a batch boundary: canceled or taken back (`lost`), or the worker
    drains."""

    def __init__(self, *, lost: bool) -> None:
        super().__init__("lease lost" if lost else "draining")
        self.lost = lost


class _ShardFailed(Exception):
    """The shard fails for good (its own fault), with this code."""

    def __init__(self, code: JobErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Tally:
    """What a shard's run has come to so far."""

    done: int = 0  # records read, good and bad
    written: int = 0  # records whose outputs went to the part
    errors: list[BadRecord] = field(default_factory=list)
    model_failures: int = 0  # records the model raised on
    first_failure: str = ""
    busy_s: float = 0.0
    reported_at: float = field(default_factory=time.monotonic)


@dataclass
class ShardRunner:
    """Runs the shards of one task, one at a time, in the task's thread (see the module)."""

    task: Task
    sessions: sessionmaker[Session]
    heartbeat: Heartbeat
    notify: Notify
    wake: Wake
    lease_s: float
    draining: Callable[[], bool]
    # Which locations a transform may read and write (None: this process's settings).
    settings: Settings | None = None
    # Counts the device seconds of each forward pass (the batcher's busy meter and metrics).
    on_busy: Callable[[float], None] = lambda seconds: None

    def run(self, lease: Lease) -> BatchReport:
        """Run one claimed shard to its end; raises what the task must retry after (its lease
        handed back first)."""
        report = BatchReport(claimed=1, samples=lease.samples)
        tally = _Tally()
        try:
            self._end(lease, report, tally)
        except _ShardFailed as exc:
            report.written = self._fail(lease, exc.code, exc.message, tally)
            report.failed = 1
        except _Stopped as exc:
            self.heartbeat.drop([lease])
            if not exc.lost:
                drain.put_back(
                    [lease], task=self.task, named=[], sessions=self.sessions,
                    heartbeat=self.heartbeat, wake=self.wake,
                )  # fmt: skip
            log.info("shard job %s stopped at a batch boundary (%s)", lease.job_id, exc)
        except StoreUnavailable as exc:
            objects.put_back([lease], sessions=self.sessions, heartbeat=self.heartbeat, error=exc)
            raise
        except INFRA_ERRORS:
            handoff.hand_back(
                [lease], task=self.task, sessions=self.sessions, heartbeat=self.heartbeat,
                wake=self.wake,
            )  # fmt: skip
            raise
        return report

    def _end(self, lease: Lease, report: BatchReport, tally: _Tally) -> None:
        spec = self._spec(lease)
        self._check_outputs(spec)
        part = PartWriter(spec.part, spec.output_format)
        try:
            self._stream(lease, spec, tally, part)
            tally.written = part.finish()
        except BaseException:
            part.abort()
            raise
        finally:
            self.on_busy(tally.busy_s)
        if tally.written == 0 and tally.model_failures:
            raise _ShardFailed(JobErrorCode.MODEL_ERROR, tally.first_failure)
        _replace_earlier_attempt(spec, tally)
        report.written = self._complete(lease, spec, tally)
        report.succeeded = report.written

    def _spec(self, lease: Lease) -> ShardSpec:
        try:
            return read_spec(
                lease, signature=self.task.runner.inputs,
                settings=self.settings or get_settings(),
                default_batch=self.task.policy.max_batch_size,
            )  # fmt: skip
        except ValueError as exc:
            raise _ShardFailed(JobErrorCode.INVALID_INPUT, f"transform shard: {exc}") from None

    def _check_outputs(self, spec: ShardSpec) -> None:
        """What the part cannot hold, refused before any record is read: an .npy part holds one
        output; another part's key (or `index`) column must not share an output's name."""
        outputs = list(getattr(self.task.runner, "outputs", None) or {})
        if spec.output_format == "npy" and len(outputs) > 1:
            raise _ShardFailed(
                JobErrorCode.INVALID_INPUT,
                f"an .npy part holds one output; the model has {outputs} (use parquet or jsonl)",
            )
        if spec.output_format != "npy" and spec.carried in outputs:
            raise _ShardFailed(
                JobErrorCode.INVALID_INPUT,
                f"the part's column {spec.carried!r} (the key, or the record number) has the name "
                f"of an output of the model",
            )

    def _stream(self, lease: Lease, spec: ShardSpec, tally: _Tally, part: PartWriter) -> None:
        """Every batch of the shard through the device into the part, the reader ahead."""
        try:
            with Prefetcher(spec, self.task.runner.inputs) as reader:
                for fed in reader:
                    self._boundary(lease, tally)
                    tally.errors += fed.errors
                    outputs, kept = self._forward(lease, fed, tally)
                    if len(kept):
                        part.put(_rows(spec, fed.carried[kept], outputs))
                    tally.done += fed.records
        except ObjectMissing as exc:
            raise _ShardFailed(
                JobErrorCode.INPUT_MISSING, f"{spec.source.uri}: no such file ({exc})"
            ) from None
        except (ValueError, TypeError) as exc:  # DatasetError, a part that does not take them
            raise _ShardFailed(JobErrorCode.INVALID_INPUT, f"{spec.source.uri}: {exc}") from None

    def _boundary(self, lease: Lease, tally: _Tally) -> None:
        """Between two batches: stop if the worker drains; every PROGRESS_EVERY_S, record the
        progress and stop if the lease no longer holds."""
        if self.draining():
            raise _Stopped(lost=False)
        now = time.monotonic()
        if now - tally.reported_at < PROGRESS_EVERY_S:
            return
        tally.reported_at = now
        with self.sessions.begin() as session:
            held = jobs.progress(
                session=session, lease=lease, samples_done=tally.done, lease_s=self.lease_s
            )
        if not held:
            raise _Stopped(lost=True)

    def _forward(self, lease: Lease, fed: Fed, tally: _Tally) -> tuple[Arrays, np.ndarray]:
        """The model's outputs for the batch's good records, and which rows of it they are: a
        chunk that makes the model raise runs record by record, and those that still raise go
        to the errors file."""
        chunk = self.task.policy.max_batch_size
        outputs: list[Arrays] = []
        kept: list[np.ndarray] = []
        for start in range(0, len(fed), chunk):
            stop = min(len(fed), start + chunk)
            try:
                outputs.append(self._run(lease, fed.arrays, slice(start, stop), tally))
                kept.append(np.arange(start, stop))
            except Exception:
                for row in range(start, stop):
                    try:
                        outputs.append(self._run(lease, fed.arrays, slice(row, row + 1), tally))
                        kept.append(np.arange(row, row + 1))
                    except Exception:
                        reason = pipeline.describe_failure()
                        tally.model_failures += 1
                        tally.first_failure = tally.first_failure or reason
                        tally.errors.append((_record(fed, row), _key(fed, row), reason))
        if not outputs:
            return {}, np.empty(0, dtype=np.int64)
        if len(outputs) == 1:
            return outputs[0], kept[0]
        joined = {name: np.concatenate([out[name] for out in outputs]) for name in outputs[0]}
        return joined, np.concatenate(kept)

    def _run(self, lease: Lease, arrays: Arrays, rows: slice, tally: _Tally) -> Arrays:
        """One forward pass over `rows` (views, no copy), padded to a bucket, under the model's
        time limit."""
        task = self.task
        batch = {name: values[rows] for name, values in arrays.items()}
        size = len(next(iter(batch.values())))
        padded = task.policy.padded_size(size)
        if padded > size:
            batch = {name: _pad(values, padded - size) for name, values in batch.items()}
        started = time.perf_counter()
        with self.heartbeat.hold(
            model=task.model, version=task.version, leases=[lease],
            timeout_s=task.policy.timeout_s,
        ):  # fmt: skip
            try:
                out = task.runner.run(batch)
            finally:
                tally.busy_s += time.perf_counter() - started
        return {name: np.asarray(values)[:size] for name, values in out.items()}

    def _complete(self, lease: Lease, spec: ShardSpec, tally: _Tally) -> int:
        """The job completes with its counts, counted into its transform, in one transaction."""
        failed = len(tally.errors)
        outputs = counts(spec.records, tally.written, failed)
        with self.sessions.begin() as session:
            now = clock.now(session)
            written = jobs.complete(
                session=session, results=[(lease, outputs)], now=now,
                device_s={lease.job_id: tally.busy_s},
            )  # fmt: skip
            _record_usage(session, self.task.model, lease, tally, now, ended=bool(written))
            if written:
                transforms.shard_finished(
                    session, job_id=lease.job_id, transform_id=spec.transform,
                    succeeded=tally.written, failed=failed,
                )  # fmt: skip
        self.heartbeat.drop([lease])
        metrics.JOBS_FINISHED.labels(self.task.model, "succeeded").inc(written)
        self.notify([lease.job_id])
        log.info(
            "shard %d of transform %s: %d records, %d to its part, %d bad",
            spec.shard, spec.transform, spec.records, tally.written, failed,
        )  # fmt: skip
        return written

    def _fail(self, lease: Lease, code: JobErrorCode, message: str, tally: _Tally) -> int:
        with self.sessions.begin() as session:
            failed = jobs.fail(
                session=session, leases=[lease], code=code, message=message,
                device_s={lease.job_id: tally.busy_s},
            )  # fmt: skip
            _record_usage(
                session, self.task.model, lease, tally, clock.now(session), ended=bool(failed)
            )
        self.heartbeat.drop([lease])
        metrics.JOBS_FINISHED.labels(self.task.model, "failed").inc(failed)
        self.notify([lease.job_id])
        log.warning("shard job %s failed %s: %s", lease.job_id, code.value, message)
        return failed


def _record_usage(
    session: Session, model: str, lease: Lease, tally: _Tally, now: datetime, *, ended: bool
) -> None:
    """A shard's usage (db/usage.py), in the transaction that ends it: its records as samples,
    its forward passes' seconds; counted as a job only where this ended it (its lease held)."""
    cost = usage.Batch(model)
    cost.add(
        lease.tenant,
        ended=ended,
        samples=tally.done if ended else 0,
        device_s=tally.busy_s,
        queue_s=usage.seconds(lease.created_at, lease.started_at) if ended else 0.0,
        run_s=usage.seconds(lease.started_at, now) if ended else 0.0,
    )
    usage.record(session, cost, at=now)
    metrics.DEVICE_SECONDS.labels(lease.tenant or "", model).inc(tally.busy_s)


def _replace_earlier_attempt(spec: ShardSpec, tally: _Tally) -> None:
    """Write the shard's errors file (its bad records in record order: the reader's, the
    mapping's and the model's were gathered apart), and delete what an earlier attempt (a
    worker killed after it wrote, before its shard completed) left that this one did not write:
    its part where this attempt had no good record, its errors file where it had no bad one.
    The shard's files are then this attempt's alone, never a stale errors file beside a part."""
    stale = []
    if tally.written == 0:
        stale.append(spec.part)
    if tally.errors:
        tally.errors.sort(key=lambda error: error[0])
        writers.write_errors(spec.errors, tally.errors)
    else:
        stale.append(spec.errors)
    for location in stale:
        location.store.delete([location.key])


def _rows(spec: ShardSpec, carried: np.ndarray, outputs: Arrays) -> Arrays:
    """A batch of the part: the key (or record number) first, then every output; an .npy part
    holds the outputs alone (its one column: writers refuse more)."""
    if spec.output_format == "npy":
        return dict(outputs)
    return {spec.carried: carried, **outputs}


def _record(fed: Fed, row: int) -> int:
    """The record number of a row of the batch (its key aside, the part carries it)."""
    return int(fed.index[row])


def _key(fed: Fed, row: int) -> object:
    return fed.keys[row] if fed.keys is not None else None


def _pad(array: np.ndarray, rows: int) -> np.ndarray:
    fill = b"" if array.dtype == object else 0
    return np.concatenate([array, np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)])
