"""A batch's three stages, as plain functions over a `Runner`: decode, forward, encode.

    decode   the claimed jobs' stored inputs into one batch per sample shape (host memory); an
             input held in the object store is a view of its object, fetched before
             (worker/objects.py)
    forward  the model on the device: padded to a bucket, in chunks of max_batch_size
    encode   each job's rows of the outputs, packed for the database (those written to the
             object store packed as references)

`worker.batching.Batcher` runs them in different threads so the device never waits: while batch
k runs `forward`, batch k+1 is claimed and decoded and batch k-1 encoded and written. Nothing
here touches the database or TensorFlow, so tests pass a function for the model.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from db.jobs import Lease
from db.models import JobErrorCode
from tffleet import tensors
from tffleet.tensors import Reference

_ALIGN = 64  # the alignment TensorFlow's kernels want of a buffer (EIGEN_MAX_ALIGN_BYTES)


@dataclass(frozen=True)
class Failure:
    """A job's own fault other than its model's (a plain message is `model_error`)."""

    code: JobErrorCode
    message: str


Arrays = dict[str, np.ndarray]
# Packed outputs, or an error message (`model_error`), or a failure of another code.
Outcome = tuple[Lease, bytes | str | Failure]


class Runner(Protocol):
    inputs: dict[str, dict[str, Any]]

    def run(self, batch: Arrays) -> Arrays: ...


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


@dataclass(frozen=True)
class Task:
    """What one Celery task runs: a model version, how, and what its jobs' `worker` says."""

    model: str
    version: int
    runner: Runner
    policy: BatchPolicy
    # This child's lease owner, and the task running the jobs: in Flower, /task/<id> is its batch.
    worker: str


@dataclass
class Group:
    """Jobs whose samples have the same shape: they run in one forward pass."""

    jobs: list[tuple[Lease, Arrays]]
    batch: Arrays  # their inputs, joined in order

    @property
    def samples(self) -> int:
        return sum(lease.samples for lease, _ in self.jobs)


@dataclass
class Decoded:
    """A claimed batch, ready for the device."""

    leases: list[Lease]
    groups: list[Group]
    failed: list[Outcome]  # jobs whose stored inputs could not be read
    # Transforms' shards claimed with it: each runs alone, through worker/transform.py.
    shards: list[Lease] = field(default_factory=list)


@dataclass
class Ran:
    """A batch after its forward passes: each job's rows of the outputs, or its error."""

    leases: list[Lease]
    outputs: list[tuple[Lease, Arrays]] = field(default_factory=list)
    failed: list[Outcome] = field(default_factory=list)
    busy_s: float = 0.0  # seconds spent in the model's forward passes
    # Each job's share of them, by job id: every pass's seconds split among the jobs whose
    # samples it ran, by their samples (padding is nobody's): they add up to `busy_s`.
    device_s: dict[str, float] = field(default_factory=dict)


def decode(
    leases: Sequence[Lease],
    *,
    runner: Runner,
    objects: Mapping[str, memoryview] | None = None,
    missing: Mapping[str, str] | None = None,
) -> Decoded:
    """Read each job's inputs and join the jobs whose sample shapes agree.

    `objects`: by key, the objects the inputs point to (worker/objects.py); `missing`: by job
    id, why a job's object is gone: it fails `input_missing`."""
    failed: list[Outcome] = []
    by_shape: dict[tuple[Any, ...], list[tuple[Lease, Arrays]]] = {}
    for lease in leases:
        if missing and lease.job_id in missing:
            failed.append((lease, Failure(JobErrorCode.INPUT_MISSING, missing[lease.job_id])))
            continue
        try:
            arrays = tensors.unpack(lease.inputs, objects)
        except Exception:
            # An unreadable blob is that job's fault alone: raising here would strand the whole
            # batch until its leases expire, and cost every job in it an attempt.
            failed.append((lease, describe_failure()))
            continue
        key = tuple((name, arrays[name].shape[1:]) for name in sorted(arrays))
        by_shape.setdefault(key, []).append((lease, arrays))
    names = list(runner.inputs)
    groups = []
    for jobs in by_shape.values():
        if len(jobs) == 1:  # a large job usually runs alone: no copy of its inputs
            batch = {name: jobs[0][1][name] for name in names}
        else:
            batch = {name: _joined([arrays[name] for _, arrays in jobs]) for name in names}
        groups.append(Group(jobs=jobs, batch=batch))
    return Decoded(leases=list(leases), groups=groups, failed=failed)


def forward(decoded: Decoded, *, runner: Runner, policy: BatchPolicy) -> Ran:
    """Run every group; a group that makes the model raise runs job by job, to find the one."""
    ran = Ran(leases=decoded.leases, failed=list(decoded.failed))
    for group in decoded.groups:
        try:
            _run_group(group, ran, runner=runner, policy=policy)
        except Exception:
            if len(group.jobs) == 1:
                ran.failed.append((group.jobs[0][0], describe_failure()))
                continue
            # One bad job must not fail the others.
            for lease, arrays in group.jobs:
                alone = Group(jobs=[(lease, arrays)], batch={n: arrays[n] for n in runner.inputs})
                try:
                    _run_group(alone, ran, runner=runner, policy=policy)
                except Exception:
                    ran.failed.append((lease, describe_failure()))
    return ran


def encode(
    ran: Ran, *, references: Mapping[str, Mapping[str, Reference]] | None = None
) -> list[Outcome]:
    """Each job's outputs packed for the database (or its error). `references`: by job id, the
    outputs written to the object store, packed as references in place of their arrays."""
    outcomes: list[Outcome] = []
    for lease, outputs in ran.outputs:
        stored = (references or {}).get(lease.job_id, {})
        inline = {name: array for name, array in outputs.items() if name not in stored}
        try:
            outcomes.append((lease, tensors.pack(inline, stored)))
        except Exception:
            outcomes.append((lease, describe_failure()))
    return outcomes + ran.failed


def run_leases(leases: Sequence[Lease], *, runner: Runner, policy: BatchPolicy) -> list[Outcome]:
    """All three stages in one go, for callers that need no overlap."""
    return encode(forward(decode(leases, runner=runner), runner=runner, policy=policy))


def describe_failure() -> str:
    """The exception being handled, in one line: its first line and, where more follow, the
    last line that is not part of a traceback. TensorFlow's op errors say only "Graph
    execution error:" first and name the cause at the end ("Matrix size-incompatible: ...")."""
    exc = sys.exc_info()[1]
    lines = str(exc).splitlines()
    head = next((line.strip() for line in lines if line.strip()), "")
    cause = [
        line.strip()
        for line in lines[1:]
        if line.strip() and not line[:1].isspace() and not line.startswith("Detected at node")
    ]
    text = f"{head} {cause[-1]}" if cause and cause[-1] != head else head
    return f"{type(exc).__name__}: {text}"[:1000]


def _run_group(group: Group, ran: Ran, *, runner: Runner, policy: BatchPolicy) -> None:
    leases = [lease for lease, _ in group.jobs]
    outputs = _forward(group.batch, leases=leases, ran=ran, runner=runner, policy=policy)
    start = 0
    for lease, _ in group.jobs:
        end = start + lease.samples
        ran.outputs.append((lease, {k: v[start:end] for k, v in outputs.items()}))
        start = end


def _forward(
    batch: Arrays, *, leases: Sequence[Lease], ran: Ran, runner: Runner, policy: BatchPolicy
) -> Arrays:
    """Pad to a bucket and run; a batch over max_batch_size runs in chunks, joined in order.
    Each pass's seconds go to the jobs whose rows it ran (`_share`), whether it raised or not."""
    total = sum(lease.samples for lease in leases)
    parts: list[Arrays] = []
    for start in range(0, total, policy.max_batch_size):
        chunk = {k: v[start : start + policy.max_batch_size] for k, v in batch.items()}
        size = len(next(iter(chunk.values())))
        padded = policy.padded_size(size)
        if padded > size:
            chunk = {k: _pad(v, padded - size) for k, v in chunk.items()}
        started = time.perf_counter()
        try:
            out = runner.run(chunk)
        finally:
            spent = time.perf_counter() - started
            ran.busy_s += spent
            _share(ran.device_s, leases, start, size, spent)
        parts.append({k: np.asarray(v)[:size] for k, v in out.items()})
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _share(
    shares: dict[str, float], leases: Sequence[Lease], start: int, size: int, seconds: float
) -> None:
    """Split one pass's `seconds` over rows `start` to `start + size` of the jobs `leases`
    hold, in order, among those jobs by how many of those rows each has."""
    if len(leases) == 1:  # the usual large job, or a batch of one: no arithmetic
        job_id = leases[0].job_id
        shares[job_id] = shares.get(job_id, 0.0) + seconds
        return
    per_row = seconds / size if size else 0.0
    end, offset = start + size, 0
    for lease in leases:
        rows = min(end, offset + lease.samples) - max(start, offset)
        offset += lease.samples
        if rows > 0:
            shares[lease.job_id] = shares.get(lease.job_id, 0.0) + rows * per_row
        elif offset >= end:
            break


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays joined in order (one copy), into memory 64-byte aligned: TensorFlow takes that
    as it is (worker/runtime/feed.py), where numpy's own allocation it would copy again."""
    if arrays[0].dtype == object:
        return np.concatenate(arrays)
    shape = (sum(len(a) for a in arrays), *arrays[0].shape[1:])
    dtype = np.result_type(*arrays)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    out = raw[start : start + nbytes].view(dtype).reshape(shape)
    return np.concatenate(arrays, out=out)


def _pad(array: np.ndarray, rows: int) -> np.ndarray:
    """`array` with `rows` more of zeros, False or b"" (strings: np.zeros would put 0 there)."""
    fill = b"" if array.dtype == object else 0
    return np.concatenate([array, np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)])
