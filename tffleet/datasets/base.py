"""What every format shares: a file's schema (`Column`, `FileInfo`), the batches a read yields
(`Batch`), and the index of byte offsets that lets a shard of a text or TFRecord file start where
its first record is instead of at the file's start (`RecordIndex`).

A record is a row of a table (Parquet, CSV), a line (JSON Lines), an Example (TFRecord) or an
array's first-axis item (.npy); records are numbered from 0 in file order, and a shard is a range
`[start, stop)` of them. Dtypes are named as signatures name them ("float32", "int64", "string").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A text or TFRecord file's index keeps the byte offset of every INDEX_EVERY-th record: a shard
# reads at most this many records it does not need, and the index of a file of a million records
# is under a thousand numbers (small enough for the API to keep beside its transform).
INDEX_EVERY = 1024


class DatasetError(ValueError):
    """A file that cannot be read as its format says (a bad header, no records, a schema that
    cannot be told); the message names the file's URI. A bad record is no DatasetError: it is
    reported in its batch's `errors` and the rest go on."""


@dataclass(frozen=True)
class Column:
    """One column (or feature) of a file: the dtype of its values and the shape of one record's
    value, -1 where it varies from record to record."""

    dtype: str
    shape: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class RecordIndex:
    """Where records start in a file read sequentially: `offsets[i]` is the byte offset of record
    `i * every`, `end` the offset past the last record (a header or trailing bytes excluded).
    Built once by `inspect`, kept as JSON (`to_json`), handed back to each shard's `read`."""

    every: int
    offsets: tuple[int, ...]
    end: int

    def start_of(self, record: int) -> tuple[int, int]:
        """The sampled record at or before `record`, and its byte offset: where a read of
        `record` onwards starts."""
        slot = min(record // self.every, len(self.offsets) - 1) if self.offsets else 0
        if not self.offsets:
            return 0, self.end
        return slot * self.every, self.offsets[slot]

    def end_of(self, record: int) -> int:
        """A byte offset at or past the start of `record` (where a read up to it may end)."""
        slot = -(-record // self.every)
        return self.offsets[slot] if slot < len(self.offsets) else self.end

    def to_json(self) -> dict[str, Any]:
        return {"every": self.every, "offsets": list(self.offsets), "end": self.end}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordIndex:
        offsets = tuple(int(o) for o in data["offsets"])
        if list(offsets) != sorted(offsets) or int(data["every"]) < 1:
            raise ValueError("a record index's offsets must ascend and `every` be positive")
        return cls(every=int(data["every"]), offsets=offsets, end=int(data["end"]))


class IndexBuilder:
    """Collects the offsets of every `every`-th record during a scan."""

    def __init__(self, every: int = INDEX_EVERY) -> None:
        self.every = every
        self.records = 0
        self.offsets: list[int] = []

    def add(self, offset: int) -> None:
        """One more record, starting at `offset`."""
        if self.records % self.every == 0:
            self.offsets.append(offset)
        self.records += 1

    def build(self, end: int) -> RecordIndex:
        return RecordIndex(every=self.every, offsets=tuple(self.offsets), end=end)


@dataclass(frozen=True)
class FileInfo:
    """What `inspect` learnt of a file: its records, its columns, and (text and TFRecord files)
    the index a shard's read starts from."""

    records: int
    schema: dict[str, Column]
    index: RecordIndex | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "schema": {name: column.to_json() for name, column in self.schema.items()},
            "index": self.index.to_json() if self.index else None,
        }


@dataclass
class Batch:
    """Consecutive records of one shard, those that could be read: `columns` each hold one row
    per good record (an object array of per-record arrays where their shapes differ), `index`
    their record numbers, `keys` the key column's values when one was asked for. `errors`: the
    records of this stretch that could not be read, as (record number, reason)."""

    columns: dict[str, np.ndarray]
    index: np.ndarray
    keys: np.ndarray | None = None
    errors: list[tuple[int, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.index)


def check_range(start: int, stop: int, records: int | None = None) -> None:
    """A shard's record range, refused when it is not one (a ValueError naming it)."""
    if start < 0 or stop < start or (records is not None and stop > records):
        where = f" of {records} records" if records is not None else ""
        raise ValueError(f"records [{start}, {stop}){where}: not a range of the file")


def stacked(values: list[np.ndarray], dtype: str) -> np.ndarray:
    """Per-record values as one array (records first) when they share a shape, else an object
    array holding each (the mapping to inputs checks each record's shape)."""
    np_dtype = object if dtype == "string" else np.dtype(dtype)
    shapes = {value.shape for value in values}
    if len(shapes) <= 1:
        if not values:
            return np.empty((0,), dtype=np_dtype)
        return np.stack(values).astype(np_dtype, copy=False)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def selected(
    uri: str,
    columns: list[str] | None,
    key: str | None,
    *,
    every: Iterable[str],
    has: list[str],
    what: str = "column",
) -> tuple[list[str], list[str]]:
    """The columns a read returns (`columns`, else `every`) and those it reads (the key too): a
    DatasetError naming those the file does not have (`has`), before anything is read."""
    names = list(columns if columns is not None else every)
    wanted = names + ([key] if key is not None and key not in names else [])
    missing = sorted(set(wanted) - set(has))
    if missing:
        raise DatasetError(f"{uri}: no {what} {missing} (it has {has})")
    return names, wanted


def parsed_batches(
    records: Iterable[bytes],
    number: int,
    shard: tuple[int, int],
    parse: Callable[[bytes], dict[str, Any]],
    bad: tuple[type[Exception], ...],
    *,
    batch_records: int,
    names: list[str],
    key: str | None,
    schema: dict[str, Column],
) -> Iterator[Batch]:
    """The records of `shard` (`[start, stop)`) among `records` (the first of them number
    `number`), each `parse`d, in batches: a record whose parse raises one of `bad` is a bad
    record (an error of its batch), so that one bad line or Example does not fail the shard."""
    start, stop = shard
    rows: list[tuple[int, dict[str, Any]]] = []
    errors: list[tuple[int, str]] = []
    for record in records:
        if number >= stop:
            break
        if number >= start:
            try:
                rows.append((number, parse(record)))
            except bad as exc:
                errors.append((number, str(exc) or type(exc).__name__))
            if len(rows) + len(errors) >= batch_records:
                yield _batch(rows, errors, names, key, schema)
                rows, errors = [], []
        number += 1
    if rows or errors:
        yield _batch(rows, errors, names, key, schema)


def _batch(
    rows: list[tuple[int, dict[str, Any]]],
    errors: list[tuple[int, str]],
    names: list[str],
    key: str | None,
    schema: dict[str, Column],
) -> Batch:
    columns = {name: stacked([row[name] for _, row in rows], schema[name].dtype) for name in names}
    keys = stacked([row[key] for _, row in rows], schema[key].dtype) if key else None
    index = np.array([number for number, _ in rows], dtype=np.int64)
    return Batch(columns=columns, index=index, keys=keys, errors=errors)
