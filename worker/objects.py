"""A child's side of the object store (DESIGN §13): the objects its jobs' inputs point to, fetched
before the forward pass, and the outputs too large for a row, written as whole `.npy` objects.

Inputs. `Objects.fetch` gets every object a batch's references name, in parallel (a small pool
of threads), from the feeder's thread (worker/feeder.py `Feeder.hold`): while the device runs
batch k, the objects of batch k+1 arrive. Each object is one buffer that numpy views without a
copy (`ObjectStore.get`; a directory store's big ones are memory maps of their files, never
read into memory of ours), so a job that runs alone copies none of its inputs and a batch of
several copies once, where decode joins them (worker/pipeline.py); TensorFlow takes a mapped
object, or a joined batch, as it is (worker/runtime/feed.py). A part of a split job reads only
its own rows' bytes of its job's object (`ObjectStore.get_range`): its inputs are handed on
pointing at that range (`Fetched.inputs`), so the part's data is still not copied.

Outputs. An output over `inline_max_bytes` (numeric and bool dtypes: a string tensor's layout is
ours, not .npy's) is written whole to `<tenant>/jobs/<job id>/outputs/<name>.npy` and packed as a
`Reference` (worker/writer.py): the database holds no big blob. The parts of a split job keep
their outputs inline: their job joins them (db/parts.py `settle`), writing a joined output over
the limit to the store in turn (`parts.Spill`).

What goes wrong (worker/retry.py maps it with the rest):
- An input's object is missing: it was deleted after the job was submitted (its upload expired
  and was swept, or its job's inputs were dropped). That job alone fails `input_missing`, naming
  the input; never retried, as the same input would be missing again.
- The store does not answer (`StoreUnavailable`): nobody's fault. The batch goes back to the
  queue unstarted and costs no attempt (`put_back`), and the task raises for Celery to try again
  with back-off, as after a lost database: the jobs run once the store is back.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.jobs import Lease
from tffleet import tensors
from tffleet.objectstore import ObjectMissing, ObjectStore, StoreUnavailable, keys
from tffleet.tensors import Reference
from worker.heartbeat import Heartbeat

log = logging.getLogger(__name__)

# Gets and puts in flight at once: enough to hide an S3 round trip per object, few enough that
# a batch's objects do not crowd the child's memory before its forward pass.
THREADS = 8

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Fetched:
    """What a batch's references name: the objects by key, and the jobs whose objects are gone
    (by job id, the message their `input_missing` failure carries)."""

    objects: dict[str, memoryview] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    # By job id, the inputs of a part of a split job, their references pointing at the ranges
    # read (by `range_key`, in `objects`) in place of the whole object: what it runs on.
    inputs: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class _Read:
    """One get: a whole object, or the bytes `start` to `end` of it (a part's rows)."""

    key: str
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True)
class Written:
    """A batch's outputs written to the store: each job's references (by job id, then output
    name), the bytes it now owns there, and the jobs whose outputs could not be written."""

    references: dict[str, dict[str, Reference]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    unwritten: list[Lease] = field(default_factory=list)
    error: StoreUnavailable | None = None  # why they could not (the first store error)


class Objects:
    """One child's store, opened once at its init (worker/child.py), and its pool of threads."""

    def __init__(
        self, store: ObjectStore, *, inline_max_bytes: int, threads: int = THREADS
    ) -> None:
        self.store = store
        self.inline_max_bytes = inline_max_bytes
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="object-store")

    # ─── Inputs ─────────────────────────────────────────────────────────────────────────────────

    def fetch(self, leases: Sequence[Lease]) -> Fetched:
        """The objects the leases' inputs point to, each fetched once, all at once; for a part
        of a split job, only its rows' range. Raises `StoreUnavailable` (after every get ended)
        when the store did not answer one."""
        wanted: dict[str, list[tuple[str, str]]] = {}  # read: (job id, input name) naming it
        reads: dict[str, _Read] = {}
        ranged: dict[str, dict[str, Reference]] = {}  # job id: its references, repointed
        for lease in leases:
            for name, ref in _references(lease.inputs).items():
                read_key = ref.key
                if lease.parent_id is not None:
                    read_key = range_key(ref)
                    reads[read_key] = _Read(ref.key, ref.offset, ref.offset + ref.nbytes)
                    ranged.setdefault(lease.job_id, {})[name] = dataclasses.replace(
                        ref, key=read_key, offset=0
                    )
                else:
                    reads[read_key] = _Read(ref.key)
                wanted.setdefault(read_key, []).append((lease.job_id, name))
        if not wanted:
            return Fetched()
        gets = {read_key: self._pool.submit(self._get, read) for read_key, read in reads.items()}
        fetched = Fetched()
        unavailable: StoreUnavailable | None = None
        for read_key, get in gets.items():
            try:
                fetched.objects[read_key] = get.result()
            except ObjectMissing:
                for job_id, name in wanted[read_key]:
                    fetched.missing.setdefault(job_id, missing_message(name, reads[read_key].key))
            except StoreUnavailable as exc:
                unavailable = unavailable or exc
        if unavailable is not None:
            raise unavailable
        by_id = {lease.job_id: lease for lease in leases}
        for job_id, refs in ranged.items():
            if job_id not in fetched.missing:
                fetched.inputs[job_id] = _repointed(by_id[job_id].inputs, refs)
        return fetched

    def _get(self, read: _Read) -> memoryview:
        if read.start is None or read.end is None:
            return self.store.get(read.key)
        if read.end <= read.start:
            return memoryview(b"")  # no rows: no request
        return self.store.get_range(read.key, read.start, read.end)

    # ─── Outputs ────────────────────────────────────────────────────────────────────────────────

    def too_big(self, outputs: Sequence[tuple[Lease, Arrays]]) -> list[Lease]:
        """The leases with an output to write to the store (see `write`)."""
        return [lease for lease, arrays in outputs if self._spilled(lease, arrays)]

    def write(self, outputs: Sequence[tuple[Lease, Arrays]]) -> Written:
        """Write each output over `inline_max_bytes` as a whole .npy, all at once; the caller
        made each job's `stored_bytes` at least 0 first (`db.jobs.reserve_storage`). A job one
        of whose objects the store did not take is `unwritten`, the others are referenced."""
        puts: list[tuple[Lease, str, Future[Reference]]] = []
        for lease, arrays in outputs:
            for name in self._spilled(lease, arrays):
                puts.append((lease, name, self._pool.submit(self._put, lease, name, arrays[name])))
        references: dict[str, dict[str, Reference]] = {}
        unwritten: dict[str, Lease] = {}
        error: StoreUnavailable | None = None
        for lease, name, put in puts:
            try:
                references.setdefault(lease.job_id, {})[name] = put.result()
            except StoreUnavailable as exc:
                unwritten[lease.job_id] = lease
                error = error or exc
        for job_id in unwritten:  # one output missing: the job runs again, whole
            references.pop(job_id, None)
        sizes = {
            job_id: sum(ref.offset + ref.nbytes for ref in refs.values())
            for job_id, refs in references.items()
        }
        return Written(references, sizes, list(unwritten.values()), error)

    def _spilled(self, lease: Lease, arrays: Arrays) -> list[str]:
        """The names of a job's outputs that go to the store: numeric, over the limit, of a
        job whose tenant is known and that is no part of a split job."""
        if lease.tenant is None or lease.parent_id is not None:
            return []
        return [
            name
            for name, array in arrays.items()
            if array.dtype.name in tensors.DTYPES
            and not tensors.is_string(array)
            and array.nbytes > self.inline_max_bytes
        ]

    def _put(self, lease: Lease, name: str, array: np.ndarray) -> Reference:
        """One output as a whole .npy object (one copy: the header joined to its bytes)."""
        assert lease.tenant is not None
        key = keys.output_key(lease.tenant, lease.job_id, name)
        data, reference = tensors.npy_object(key, array)
        self.store.put(key, data)
        return reference


def range_key(ref: Reference) -> str:
    """What names the bytes of `ref` alone (never a store key: `#` is in none)."""
    return f"{ref.key}#{ref.offset}-{ref.offset + ref.nbytes}"


def _repointed(blob: bytes, references: Mapping[str, Reference]) -> bytes:
    """`blob` with these references in place of its own: its inline tensors as they were (a
    part's are small; its large ones are references)."""
    return tensors.pack(tensors.unpack(blob, inline_only=True), references)


def missing_message(name: str, key: str) -> str:
    return (
        f"input {name!r}: its object ({key}) was deleted from the object store after the job "
        "was submitted"
    )


def put_back(
    leases: Sequence[Lease],
    *,
    sessions: sessionmaker[Session],
    heartbeat: Heartbeat,
    error: StoreUnavailable,
) -> None:
    """The store did not answer for a batch: its jobs go back to the queue as if never claimed
    (no attempt spent), where the database answers; if not, their leases expire and the sweeper
    requeues them. The task then raises for Celery to try again later."""
    if not leases:
        return
    heartbeat.drop(leases)
    try:
        with sessions.begin() as session:
            jobs.unclaim(
                session=session, leases=leases, reason=f"the object store did not answer ({error})"
            )
    except Exception as exc:
        log.warning(
            "could not put back %d jobs (%s: %s); the sweeper requeues them once their leases "
            "expire",
            len(leases), type(exc).__name__, exc,
        )  # fmt: skip
        return
    log.warning("put back %d jobs: %s", len(leases), error)


def _references(blob: bytes) -> Mapping[str, Reference]:
    """A blob's references; none for a blob that does not read (decode fails its job)."""
    try:
        return tensors.references(blob)
    except (tensors.TensorError, ValueError):
        return {}
