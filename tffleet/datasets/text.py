"""CSV and JSON Lines, read without loading the file: a record ends at a newline (CSV: one
outside double quotes, so a quoted field may hold newlines, RFC 4180's `""` escape included).

`inspect` scans the file once in windows for record boundaries and keeps the offset of every
`INDEX_EVERY`-th record (`RecordIndex`); a shard's `read` starts at the offset sampled at or
before its first record, so it reads at most that many records it does not need. A CSV's first
record is its header (the column names); its values are int64, float64 or strings. A JSON Lines
record is an object; a field's dtype and shape come from the records. Both formats tell their
schema from the file's first `SAMPLE_RECORDS` records (those that do not parse are skipped), no
more: a file's schema is the same whatever its index's spacing. A later record that does not
parse, lacks a column or does not fit its dtype or shape (text where the first records held
numbers, a fraction in an int64 column) is a bad record at read time, reported with its number
and reason; it never refuses the whole file.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from tffleet.datasets import access
from tffleet.datasets.base import (
    INDEX_EVERY,
    Batch,
    Column,
    DatasetError,
    FileInfo,
    RecordIndex,
    check_range,
    parsed_batches,
    selected,
)
from tffleet.datasets.locations import Location

# How many of a file's first records (CSV: after its header) tell its columns' dtypes and shapes.
SAMPLE_RECORDS = 100
_NEWLINE, _QUOTE = 10, 34


def records(
    location: Location, begin: int, end: int, *, quoted: bool, window: int = access.WINDOW_BYTES
) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of each record in `[begin, end)` (begin at a record's start), its newline
    and a `\\r` before it dropped; a last record without a newline included."""
    tail, tail_at, inside, offset = b"", begin, False, begin
    for chunk in access.windows(location, begin, end, window):
        cuts, inside = _boundaries(chunk, inside, quoted=quoted)
        previous = 0
        for cut in cuts.tolist():
            body = chunk[previous:cut]
            if previous == 0 and tail:
                body = tail + body
                tail = b""
            yield tail_at, body.removesuffix(b"\r")
            previous, tail_at = cut + 1, offset + cut + 1
        tail = tail + chunk[previous:] if previous == 0 else chunk[previous:]
        offset += len(chunk)
    if tail:
        yield tail_at, tail.removesuffix(b"\r")


def _boundaries(chunk: bytes, inside: bool, *, quoted: bool) -> tuple[np.ndarray, bool]:
    """The positions of the newlines that end records, and whether the chunk ends inside quotes."""
    data = np.frombuffer(chunk, dtype=np.uint8)
    newlines = data == _NEWLINE
    if not quoted or not len(data):
        return np.flatnonzero(newlines), inside
    parity = (np.cumsum(data == _QUOTE) + int(inside)) & 1
    return np.flatnonzero(newlines & (parity == 0)), bool(parity[-1])


def _scan(location: Location, begin: int, end: int, *, quoted: bool) -> tuple[int, RecordIndex]:
    """Records from `begin` to the end, and their index, by a vectorised scan of the newlines."""
    count, inside, offset, pending = 0, False, begin, begin
    sampled: list[int] = []
    for chunk in access.windows(location, begin, end):
        cuts, inside = _boundaries(chunk, inside, quoted=quoted)
        starts = np.concatenate(([pending], offset + cuts[:-1] + 1)).astype(np.int64)
        if not len(cuts):
            starts = starts[:0]
        numbers = count + np.arange(len(starts))
        sampled += starts[numbers % INDEX_EVERY == 0].tolist()
        count += len(starts)
        if len(cuts):
            pending = offset + int(cuts[-1]) + 1
        offset += len(chunk)
    if pending < end:  # a last record without its newline
        if count % INDEX_EVERY == 0:
            sampled.append(pending)
        count += 1
    if inside:
        raise DatasetError(f'{location.uri}: a quoted field is never closed (an odd number of ")')
    return count, RecordIndex(every=INDEX_EVERY, offsets=tuple(sampled), end=end)


def _first(
    location: Location, begin: int, index: RecordIndex, *, quoted: bool
) -> Iterator[tuple[int, bytes]]:
    """The file's first `SAMPLE_RECORDS` records from `begin`, which its schema is told from:
    the read ends at the index point past them, the records after them are not taken."""
    found = records(location, begin, index.end_of(SAMPLE_RECORDS), quoted=quoted)
    for number, (offset, record) in enumerate(found):
        if number == SAMPLE_RECORDS:
            return
        yield offset, record


# ─── CSV ────────────────────────────────────────────────────────────────────────────────────────


def _csv_fields(record: bytes) -> list[str]:
    return next(csv.reader([record.decode("utf-8")], strict=True), [])


def _csv_header(location: Location) -> tuple[list[str], int]:
    """A CSV's column names, and the offset of its first record after them."""
    found: list[str] | None = None
    for offset, record in records(location, 0, access.size(location), quoted=True, window=1 << 16):
        if found is not None:
            return found, offset
        found = _csv_fields(record)
        if not found or len(set(found)) != len(found) or not all(found):
            raise DatasetError(f"{location.uri}: a CSV header of unique, non-empty names expected")
    if found is None:
        raise DatasetError(f"{location.uri}: an empty file")
    return found, access.size(location)


def _guess(values: list[str]) -> str:
    for dtype, parse in (("int64", int), ("float64", float)):
        try:
            for value in values:
                parse(value)
        except ValueError:
            continue
        return dtype
    return "string"


def inspect_csv(location: Location) -> FileInfo:
    names, begin = _csv_header(location)
    records_, index = _scan(location, begin, access.size(location), quoted=True)
    sample: list[list[str]] = []
    for _, record in _first(location, begin, index, quoted=True):
        try:
            fields = _csv_fields(record)
        except (csv.Error, UnicodeDecodeError):
            continue
        if len(fields) == len(names):
            sample.append(fields)
    schema = {name: Column(_guess([row[i] for row in sample])) for i, name in enumerate(names)}
    return FileInfo(records=records_, schema=schema, index=index)


def _csv_value(field: str, dtype: str) -> Any:
    if dtype == "int64":
        return int(field)
    if dtype == "float64" or dtype.startswith("float"):
        return float(field)
    return field.encode("utf-8")


# ─── JSON Lines ─────────────────────────────────────────────────────────────────────────────────


def _json_object(record: bytes) -> dict[str, Any]:
    if not record.strip():
        raise ValueError("an empty line")
    value = orjson.loads(record)
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    return value


def _json_column(values: list[Any]) -> Column:
    arrays = [np.asarray(value) for value in values]
    kinds = {array.dtype.kind for array in arrays}
    if kinds <= {"b"}:
        dtype = "bool"
    elif kinds <= {"i", "u", "b"}:
        dtype = "int64"
    elif kinds <= {"i", "u", "f", "b"}:
        dtype = "float64"
    else:
        dtype = "string"
    shapes = {array.shape for array in arrays}
    if len({len(shape) for shape in shapes}) != 1:
        return Column(dtype, (-1,))
    shape = tuple(dims[0] if len(set(dims)) == 1 else -1 for dims in zip(*shapes, strict=True))
    return Column(dtype, shape)


def inspect_jsonl(location: Location) -> FileInfo:
    records_, index = _scan(location, 0, access.size(location), quoted=False)
    sample: dict[str, list[Any]] = {}
    for _, record in _first(location, 0, index, quoted=False):
        try:
            for name, value in _json_object(record).items():
                sample.setdefault(name, []).append(value)
        except ValueError:
            continue
    return FileInfo(
        records=records_,
        schema={name: _json_column(values) for name, values in sample.items()},
        index=index,
    )


def _fits(array: np.ndarray, column: Column) -> bool:
    return array.ndim == len(column.shape) and all(
        want in (-1, have) for want, have in zip(column.shape, array.shape, strict=True)
    )


# ─── Shards ─────────────────────────────────────────────────────────────────────────────────────


def read(
    location: Location,
    start: int,
    stop: int,
    columns: list[str] | None,
    batch_records: int = 1024,
    *,
    format: str,
    info: FileInfo,
    key: str | None = None,
) -> Iterator[Batch]:
    """Records `[start, stop)` of a CSV (`format="csv"`) or JSON Lines file whose `inspect`
    gave `info` (its index decides where the read starts)."""
    check_range(start, stop, info.records)
    names, wanted = selected(location.uri, columns, key, every=info.schema, has=sorted(info.schema))
    assert info.index is not None
    number, begin = info.index.start_of(start)
    header = _csv_header(location)[0] if format == "csv" else []
    parse = (
        _csv_record(header, info.schema, wanted)
        if format == "csv"
        else _json_record(info.schema, wanted)
    )
    found = records(location, begin, info.index.end_of(stop), quoted=format == "csv")
    yield from parsed_batches(
        (record for _, record in found),
        number,
        (start, stop),
        parse,
        (ValueError, TypeError, csv.Error, UnicodeDecodeError),
        batch_records=batch_records,
        names=names,
        key=key,
        schema=info.schema,
    )


def _csv_record(header: list[str], schema: dict[str, Column], wanted: list[str]) -> Any:
    positions = {name: header.index(name) for name in wanted}

    def parse(record: bytes) -> dict[str, Any]:
        fields = _csv_fields(record)
        if len(fields) != len(header):
            raise ValueError(f"{len(fields)} fields where the header has {len(header)}")
        values = {}
        for name, at in positions.items():
            try:
                values[name] = np.asarray(_csv_value(fields[at], schema[name].dtype))
            except ValueError:
                raise ValueError(
                    f"column {name!r}: {fields[at]!r} is no {schema[name].dtype}"
                ) from None
        return values

    return parse


def _json_record(schema: dict[str, Column], wanted: list[str]) -> Any:
    def parse(record: bytes) -> dict[str, Any]:
        found = _json_object(record)
        values = {}
        for name in wanted:
            if name not in found or found[name] is None:
                raise ValueError(f"column {name!r} is missing or null")
            column = schema[name]
            try:
                array = _json_value(found[name], column.dtype)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"column {name!r}: not {column.dtype} ({exc})") from None
            if not _fits(array, column):
                raise ValueError(
                    f"column {name!r}: shape {list(array.shape)}, expected {list(column.shape)}"
                )
            values[name] = array
        return values

    return parse


# The kinds of JSON value each dtype a sample tells (`_json_column`) takes: a later value of
# another kind (text where numbers were, a fraction in an int64 column) is a bad record, never
# cast (numpy would read "12" as 12 and truncate 1.5 to 1).
_JSON_KINDS = {"bool": "b", "int64": "iub", "float64": "iufb"}


def _json_value(value: Any, dtype: str) -> np.ndarray:
    if dtype == "string":
        return np.asarray(value, dtype=object)
    found = np.asarray(value)
    if found.dtype.kind not in _JSON_KINDS.get(dtype, found.dtype.kind):
        raise ValueError(f"a JSON {_kind_name(found)} value")
    return found.astype(dtype, copy=False)


def _kind_name(array: np.ndarray) -> str:
    return {"b": "bool", "i": "integer", "u": "integer", "f": "fractional"}.get(
        array.dtype.kind, "text" if array.dtype.kind == "U" else "mixed"
    )
