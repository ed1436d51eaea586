"""One batch: claim the named jobs, top up with other queued jobs, run one forward pass, write.

Plain logic over a `Runner` (anything with `inputs` and `run(batch) -> outputs`), so tests can pass
a function instead of TensorFlow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.jobs import Lease
from tffleet import tensors
from worker import metrics

log = logging.getLogger(__name__)

_TOP_UP_POLL_S = 0.0005


class Runner(Protocol):
    inputs: dict[str, dict[str, Any]]

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int
    max_queue_delay_ms: float
    buckets: tuple[int, ...]

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


@dataclass
class Batcher:
    """Runs batches for one child: its sessions, its identity, how to tell the API a job ended."""

    sessions: sessionmaker[Session]
    owner: str
    lease_s: float
    notify: Callable[[Sequence[str]], None]
    _held: list[Lease] = field(default_factory=list, init=False, repr=False)
    _beat_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _beater: threading.Thread | None = field(default=None, init=False, repr=False)
    # Whether the last batch found other jobs waiting: only then is waiting for more worth it.
    _queue_busy: bool = field(default=False, init=False, repr=False)

    def run(
        self,
        *,
        model: str,
        version: int,
        job_ids: Sequence[str],
        runner: Runner,
        policy: BatchPolicy,
    ) -> BatchReport:
        """Run the jobs a message names, in batches of at most `max_batch_size` jobs, each topped
        up with other queued jobs of the same model version."""
        report = BatchReport()
        step = policy.max_batch_size
        for start in range(0, max(len(job_ids), 1), step):
            part = self._run_batch(
                model=model,
                version=version,
                job_ids=job_ids[start : start + step],
                runner=runner,
                policy=policy,
            )
            for name, value in part.as_dict().items():
                setattr(report, name, getattr(report, name) + value)
        return report

    def _run_batch(
        self,
        *,
        model: str,
        version: int,
        job_ids: Sequence[str],
        runner: Runner,
        policy: BatchPolicy,
    ) -> BatchReport:
        leases = self._claim(model=model, version=version, job_ids=job_ids, policy=policy)
        report = BatchReport(claimed=len(leases), samples=sum(lease.samples for lease in leases))
        if not leases:
            return report
        _observe_claim(model, leases)
        started = time.perf_counter()
        with self._heartbeat(leases):
            outcomes = run_leases(leases, runner=runner, policy=policy)
        metrics.BATCH_SECONDS.labels(model).observe(time.perf_counter() - started)
        succeeded = [(lease, out) for lease, out in outcomes if isinstance(out, bytes)]
        failed = [(lease, out) for lease, out in outcomes if isinstance(out, str)]
        with self.sessions.begin() as session:
            report.written = jobs.complete(session=session, results=succeeded)
            for lease, message in failed:
                report.written += jobs.fail(
                    session=session, leases=[lease], code="model_error", message=message
                )
        report.succeeded, report.failed = len(succeeded), len(failed)
        metrics.JOBS_FINISHED.labels(model, "succeeded").inc(report.succeeded)
        metrics.JOBS_FINISHED.labels(model, "failed").inc(report.failed)
        self.notify([lease.job_id for lease in leases])
        return report

    def _claim(
        self, *, model: str, version: int, job_ids: Sequence[str], policy: BatchPolicy
    ) -> list[Lease]:
        """The named jobs still queued, topped up with other queued jobs of this model version
        (priority, then age).

        While the queue is busy (the last top-up found jobs) it waits up to max_queue_delay_ms for
        more to arrive; at idle a lone job runs at once instead of waiting for company.
        """
        deadline = time.monotonic() + policy.max_queue_delay_ms / 1000
        topped_up = False
        with self.sessions.begin() as session:
            leases = jobs.claim(
                session=session, job_ids=job_ids, owner=self.owner, lease_s=self.lease_s
            )
            more = self._top_up(session, model, version, leases, policy)
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
        return leases

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
        return jobs.claim_next(
            session=session,
            model=model,
            version=version,
            owner=self.owner,
            lease_s=self.lease_s,
            max_samples=room,
            take_oversized=not leases,
        )

    @contextmanager
    def _heartbeat(self, leases: list[Lease]) -> Iterator[None]:
        """Extend these leases every third of their length while the batch runs.

        One thread per child beats whatever batch is current; starting one per batch would cost
        more than a small batch's forward pass.
        """
        with self._beat_lock:
            self._held = list(leases)
            if self._beater is None:
                self._beater = threading.Thread(
                    target=self._beat, name="lease-heartbeat", daemon=True
                )
                self._beater.start()
        try:
            yield
        finally:
            with self._beat_lock:
                self._held = []

    def _beat(self) -> None:
        while True:
            time.sleep(self.lease_s / 3)
            with self._beat_lock:
                held = list(self._held)
            if not held:
                continue
            try:
                with self.sessions.begin() as session:
                    jobs.heartbeat(session=session, leases=held, lease_s=self.lease_s)
            except Exception:
                log.exception("lease heartbeat failed; will retry")


def _observe_claim(model: str, leases: Sequence[Lease]) -> None:
    metrics.BATCH_JOBS.labels(model).observe(len(leases))
    metrics.BATCH_SAMPLES.labels(model).observe(sum(lease.samples for lease in leases))
    now = jobs.utcnow()
    for lease in leases:
        if lease.created_at is not None:
            metrics.QUEUE_WAIT_SECONDS.labels(model).observe(
                (now - lease.created_at).total_seconds()
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
            chunk = {
                k: np.concatenate([v, np.zeros((padded - size, *v.shape[1:]), dtype=v.dtype)])
                for k, v in chunk.items()
            }
        out = runner.run(chunk)
        parts.append({k: np.asarray(v)[:size] for k, v in out.items()})
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
