"""A shard's output part and its errors file, each written whole or not at all.

A part is written through one writer (`access.writer`): on S3 a multipart upload completed only
when the last batch is in, on a directory a temporary file renamed into place then. A failure
before that (a batch that raises, the store down) aborts it and leaves no part, so a shard that
runs again writes its part afresh and no reader ever sees half of one.

Parquet and JSON Lines parts are streamed batch by batch; an .npy part's header holds its row
count, so its batches are held until the last (a shard's outputs, not the dataset's).

A part of no batch is no part, in every format: nothing is written (a shard whose records were
all bad leaves its errors file alone; the transform's file listings name no part of it).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from tffleet.datasets import access
from tffleet.datasets.formats import check_format
from tffleet.datasets.locations import Location
from tffleet.tensors.arrays import raw_bytes

# The row group of a Parquet part: a reader of part k reads it by row groups.
ROW_GROUP_RECORDS = 64 * 1024


def write_part(location: Location, format: str, batches: Iterable[dict[str, np.ndarray]]) -> int:
    """Write the batches (columns by name, rows first, the same columns in each) as one part in
    `format` (parquet, jsonl, npy: one column only); returns the records written. No batch: no
    part is written (an empty file has no schema to give), and 0 is returned."""
    check_format(format, output=True)
    given = iter(batches)
    first = next(given, None)
    if first is None:
        return 0
    batches = itertools.chain([first], given)
    if format == "npy":
        return _npy(location, batches)
    written = 0
    with access.writer(location) as file:
        if format == "jsonl":
            for batch in batches:
                file.write(_jsonl(batch))
                written += _rows(batch)
            return written
        sink = pa.PythonFile(file, mode="w")
        parquet: pq.ParquetWriter | None = None
        try:
            for batch in batches:
                table = pa.table({name: _arrow(values) for name, values in batch.items()})
                if parquet is None:
                    parquet = pq.ParquetWriter(sink, table.schema)
                parquet.write_table(table, row_group_size=ROW_GROUP_RECORDS)
                written += table.num_rows
        finally:
            if parquet is not None:
                parquet.close()
    return written


def write_errors(location: Location, errors: Iterable[tuple[int, Any, str]]) -> int:
    """The errors file of a shard: JSON Lines of {"index", "key", "reason"}, whole or not at
    all; returns the lines written."""
    written = 0
    with access.writer(location) as file:
        for index, key, reason in errors:
            file.write(orjson.dumps({"index": int(index), "key": _plain(key), "reason": reason}))
            file.write(b"\n")
            written += 1
    return written


def _rows(batch: dict[str, np.ndarray]) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def _arrow(values: np.ndarray) -> pa.Array:
    """A column of records as Arrow: scalars as they are, tensors as fixed-size lists (nested
    per dimension), strings as binary."""
    if values.dtype == object:
        return pa.array([_plain(v) for v in values])
    flat: pa.Array = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def _plain(value: Any) -> Any:
    """A value as JSON and Arrow take it (bytes of UTF-8 as str, numpy scalars as Python's)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    if isinstance(value, np.generic):
        return value.item()
    return value


def _jsonl(batch: dict[str, np.ndarray]) -> bytes:
    names = list(batch)
    lines = []
    for row in range(_rows(batch)):
        record = {name: _json_value(batch[name][row]) for name in names}
        lines.append(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY))
    return b"\n".join(lines) + b"\n" if lines else b""


def _json_value(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_json_value(v) for v in value]
    return _plain(value)


def _npy(location: Location, batches: Iterable[dict[str, np.ndarray]]) -> int:
    arrays: list[np.ndarray] = []
    for batch in batches:
        if len(batch) != 1:
            raise ValueError(f"an .npy part holds one column, not {sorted(batch)}")
        arrays.append(np.ascontiguousarray(next(iter(batch.values()))))
    whole = np.concatenate(arrays)
    header = np.lib.format.header_data_from_array_1_0(whole)
    with access.writer(location) as file:
        _write_npy_header(file, header)
        file.write(raw_bytes(whole) if whole.size else b"")
    return len(whole)


def _write_npy_header(file: Any, header: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    file.write(buffer.getvalue())
