"""A shard's input and output stages, each in a thread of its own, so the device never waits.

    Prefetcher   reads the shard's records (tffleet.datasets.formats.read) and makes them the
                 model's inputs (mapping.inputs): batch k+1 is decoded while the device runs k,
                 at most `PREFETCH` batches ahead (a bounded queue: memory stays a few batches)
    PartWriter   streams the outputs of batch k-1 into the shard's output part
                 (writers.write_part), which is written whole or not at all: `abort` leaves none

This is TensorFlow's classic input pipeline (a reader thread filling a queue so that the
forward pass never waits on input), with threads and queues: the readers are tffleet.datasets'
(pyarrow for Parquet, ranged reads for .npy, its own for TFRecord, CSV and JSON Lines), which
release the GIL where the work is (pyarrow, the store's I/O, numpy's casts).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tffleet.datasets import formats, mapping, writers
from tffleet.datasets.base import Batch
from tffleet.datasets.locations import Location
from worker.transform_spec import ShardSpec

log = logging.getLogger(__name__)

# Batches decoded ahead of the device: one to hand over at once, one being decoded.
PREFETCH = 2
# Output batches waiting for the writer: it seldom lags (a model's outputs are small).
WRITE_AHEAD = 4
# Outputs held before they go to the part's writer together (object arrays count their
# pointers only: a part of strings holds more).
COALESCE_BYTES = 4 * 1024 * 1024
# How often a blocked hand-off looks whether the other side stopped.
_POLL_S = 0.1
# How long closing waits for a stage's thread (a read or write in flight) before leaving it.
_JOIN_S = 30.0

# A record that could not be used: (record number, key or None, reason).
BadRecord = tuple[int, Any, str]


@dataclass
class Fed:
    """One batch of a shard, ready for the device: the inputs of its good records, their record
    numbers and keys (None: the transform names no key column), and the records left out."""

    arrays: dict[str, np.ndarray]
    index: np.ndarray
    keys: np.ndarray | None
    errors: list[BadRecord]
    records: int  # the records this batch covered, good and bad

    def __len__(self) -> int:
        return len(self.index)

    @property
    def carried(self) -> np.ndarray:
        """What ties each row to its record in the part: its key, or its record number."""
        return self.keys if self.keys is not None else self.index


def feed(batch: Batch, signature: Mapping[str, Any], spec: ShardSpec) -> Fed:
    """A batch read from the file, made the model's inputs; bad records named with their key."""
    arrays, rows, bad = mapping.inputs(batch, signature, spec.columns)
    keys = batch.keys if spec.key is not None else None
    errors: list[BadRecord] = [(index, None, reason) for index, reason in batch.errors]
    for index, reason in bad:
        key = None
        if keys is not None:
            key = keys[int(np.searchsorted(batch.index, index))]
        errors.append((index, key, reason))
    return Fed(
        arrays=arrays,
        index=batch.index[rows],
        keys=keys[rows] if keys is not None else None,
        errors=errors,
        records=len(batch) + len(batch.errors),
    )


class _End:
    """The last item of a stage's queue."""


_END = _End()


@dataclass(frozen=True)
class _Raised:
    error: BaseException


class Prefetcher:
    """Reads a shard in a thread of its own, `PREFETCH` batches ahead; iterate it for `Fed`
    batches in record order. An error of the read (the store, a file that does not parse) is
    raised by the iteration, in the caller's thread. `close` stops the thread."""

    def __init__(self, spec: ShardSpec, signature: Mapping[str, Any]) -> None:
        self._spec = spec
        self._signature = signature
        self._queue: queue.Queue[Fed | _End | _Raised] = queue.Queue(maxsize=PREFETCH)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="shard-reader", daemon=True)

    def __enter__(self) -> Prefetcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Fed]:
        while True:
            item = self._queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_JOIN_S)
        if self._thread.is_alive():
            log.warning("a shard's reader is still reading after %gs; left to end alone", _JOIN_S)

    def _read(self) -> None:
        spec = self._spec
        try:
            batches = formats.read(
                spec.source, spec.format, spec.start, spec.stop, spec.read_columns,
                spec.batch_records, key=spec.key, info=spec.info,
            )  # fmt: skip
            for batch in batches:
                if not self._put(feed(batch, self._signature, spec)):
                    return
            self._put(_END)
        except BaseException as exc:  # handed to the device's thread, which decides
            self._put(_Raised(exc))

    def _put(self, item: Fed | _End | _Raised) -> bool:
        """Queue `item` unless the pipeline stopped meanwhile (then False)."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False


def _joined(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(batches) == 1:
        return batches[0]
    return {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}


class _Aborted(Exception):
    """Ends a part's write without completing it: no part is left."""


class PartWriter:
    """Streams output batches into one part (writers.write_part) from a thread of its own,
    started by the first batch: a shard with no good record writes no part. `finish` completes
    the part and returns its records; `abort` leaves none. A write's error is raised by the
    next `put` or by `finish`, in the caller's thread."""

    def __init__(self, location: Location, format: str) -> None:
        self._location = location
        self._format = format
        self._queue: queue.Queue[dict[str, np.ndarray] | _End | _Aborted] = queue.Queue(
            maxsize=WRITE_AHEAD
        )
        self._thread: threading.Thread | None = None
        self._written = 0
        self._error: BaseException | None = None
        self._ended = threading.Event()

    def put(self, batch: dict[str, np.ndarray]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._write, name="shard-writer", daemon=True)
            self._thread.start()
        self._hand(batch)

    def finish(self) -> int:
        """Complete the part; the records it holds (0: no part was written)."""
        if self._thread is None:
            return 0
        self._hand(_END)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._written

    def abort(self) -> None:
        """Leave no part (a write in flight is abandoned, whole)."""
        if self._thread is None or self._ended.is_set():
            return
        try:
            self._hand(_Aborted())
        except BaseException:  # the write failed already: nothing was left
            return
        self._thread.join(_JOIN_S)

    def _hand(self, item: dict[str, np.ndarray] | _End | _Aborted) -> None:
        while True:
            if self._ended.is_set():
                if self._error is not None:
                    raise self._error
                raise RuntimeError("the part's writer ended before its last batch")
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        """The batches put, joined up to `COALESCE_BYTES`: a part's row groups (and its JSON
        Lines writes) are then large, whatever the model's batch."""
        held: list[dict[str, np.ndarray]] = []
        size = 0
        while True:
            item = self._queue.get()
            if isinstance(item, _Aborted):
                raise item
            if isinstance(item, _End):
                if held:
                    yield _joined(held)
                return
            held.append(item)
            size += sum(values.nbytes for values in item.values())
            if size >= COALESCE_BYTES:
                yield _joined(held)
                held, size = [], 0

    def _write(self) -> None:
        try:
            self._written = writers.write_part(self._location, self._format, self._batches())
        except _Aborted:
            pass
        except BaseException as exc:
            self._error = exc
        finally:
            self._ended.set()
