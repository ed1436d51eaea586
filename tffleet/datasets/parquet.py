"""Parquet files, read with pyarrow by row group: `inspect` reads the footer alone (row count and
schema), a shard reads the row groups that overlap its range, and only its columns.

A column's records are scalars (`int64`, `float32`, `string` ...) or lists of them: a fixed-size
list (as pyarrow writes `pa.list_(pa.float32(), 12288)`) has a known shape, a list whose length
varies has shape -1 and each record is checked where it is used. A null is a bad record.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tffleet.datasets import access
from tffleet.datasets.base import (
    Batch,
    Column,
    DatasetError,
    FileInfo,
    check_range,
    selected,
    stacked,
)
from tffleet.datasets.locations import Location


def _open(location: Location) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(access.open_file(location))
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"{location.uri}: not a Parquet file ({exc})") from None


def column_of(type_: pa.DataType) -> Column | None:
    """A pyarrow type as a column of ours (None: a type no model input takes, a struct say)."""
    shape: list[int] = []
    while (
        pa.types.is_list(type_)
        or pa.types.is_fixed_size_list(type_)
        or (pa.types.is_large_list(type_))
    ):
        shape.append(type_.list_size if pa.types.is_fixed_size_list(type_) else -1)
        type_ = type_.value_type
    if (
        pa.types.is_string(type_)
        or pa.types.is_binary(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_large_binary(type_)
    ):
        return Column("string", tuple(shape))
    if pa.types.is_boolean(type_) or pa.types.is_integer(type_) or pa.types.is_floating(type_):
        return Column(np.dtype(type_.to_pandas_dtype()).name, tuple(shape))
    return None


def _schema(file: pq.ParquetFile) -> dict[str, Column]:
    schema = {}
    for field in file.schema_arrow:
        column = column_of(field.type)
        if column is not None:
            schema[field.name] = column
    return schema


def inspect(location: Location) -> FileInfo:
    file = _open(location)
    return FileInfo(records=file.metadata.num_rows, schema=_schema(file))


def read(
    location: Location,
    start: int,
    stop: int,
    columns: list[str] | None = None,
    batch_records: int = 1024,
    *,
    key: str | None = None,
) -> Iterator[Batch]:
    """Records `[start, stop)` in batches of `batch_records` (the last shorter): only the row
    groups that hold them are read."""
    file = _open(location)
    check_range(start, stop, file.metadata.num_rows)
    # All columns: those a model input may take (a struct column is none).
    names, wanted = selected(
        location.uri, columns, key, every=_schema(file), has=file.schema_arrow.names
    )
    groups, first = _groups(file, start, stop)
    if not groups:
        return
    batches = file.iter_batches(batch_size=batch_records, row_groups=groups, columns=wanted)
    pending: list[pa.RecordBatch] = []
    held = 0  # rows pending, the last of them record `through - 1`
    position = through = first
    for record_batch in batches:
        low, high = max(start - position, 0), min(stop - position, record_batch.num_rows)
        if high > low:
            pending.append(record_batch.slice(low, high - low))
            held, through = held + high - low, position + high
        position += record_batch.num_rows
        while held >= batch_records or (held and position >= stop):
            table = pa.Table.from_batches(pending)
            take = min(batch_records, held)
            yield _batch(table.slice(0, take), through - held, names, key)
            rest = table.slice(take)
            pending, held = rest.to_batches(), rest.num_rows
        if position >= stop:
            return


def _groups(file: pq.ParquetFile, start: int, stop: int) -> tuple[list[int], int]:
    """The row groups that overlap `[start, stop)`, and the record number the first begins at."""
    groups: list[int] = []
    first = begin = 0
    for group in range(file.metadata.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if begin + rows > start and begin < stop:
            if not groups:
                first = begin
            groups.append(group)
        begin += rows
    return groups, first


def _batch(table: pa.Table, first: int, names: list[str], key: str | None) -> Batch:
    """One batch of records from `first` on: nulls and ragged lists are bad records."""
    bad: dict[int, str] = {}
    arrays: dict[str, list[np.ndarray] | np.ndarray] = {}
    for name in names + ([key] if key is not None and key not in names else []):
        arrays[name] = _numpy(table.column(name), name, bad)
    keep = np.array([i for i in range(table.num_rows) if i not in bad], dtype=np.int64)
    columns = {}
    for name in names:
        columns[name] = _rows(arrays[name], keep, table.schema.field(name).type)
    keys = _rows(arrays[key], keep, table.schema.field(key).type) if key else None
    return Batch(
        columns=columns,
        index=first + keep,
        keys=keys,
        errors=[(first + i, reason) for i, reason in sorted(bad.items())],
    )


def _numpy(
    chunked: pa.ChunkedArray, name: str, bad: dict[int, str]
) -> list[np.ndarray] | np.ndarray:
    """A column's records: one array (records first) for a scalar or fixed-size list column
    without nulls, else a list of per-record arrays (None for a null, reported in `bad`)."""
    array = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    column = column_of(array.type)
    if column is None:
        raise DatasetError(f"column {name!r}: type {array.type} is no tensor")
    if array.null_count == 0 and all(n != -1 for n in column.shape):
        flat = array
        for _ in column.shape:
            flat = flat.flatten()
        if column.dtype == "string":
            values = np.array(flat.to_pylist(), dtype=object)
        else:
            values = flat.to_numpy(zero_copy_only=False)
        return values.reshape((len(array), *column.shape))
    records: list[np.ndarray] = []
    for i, value in enumerate(array.to_pylist()):
        if value is None or _has_none(value):
            bad.setdefault(i, f"column {name!r} is null")
            records.append(np.empty(0))
            continue
        dtype = object if column.dtype == "string" else column.dtype
        try:
            records.append(np.array(value, dtype=dtype))
        except ValueError:
            bad.setdefault(i, f"column {name!r}: its lists are ragged")
            records.append(np.empty(0))
    return records


def _has_none(value: object) -> bool:
    return isinstance(value, list) and any(v is None or _has_none(v) for v in value)


def _rows(
    values: list[np.ndarray] | np.ndarray, keep: np.ndarray, type_: pa.DataType
) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values[keep]
    column = column_of(type_)
    assert column is not None
    return stacked([values[i] for i in keep], column.dtype)
