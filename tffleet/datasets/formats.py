"""One `inspect` and one `read` over every input format, chosen by name.

    inspect(location, format) -> FileInfo        records, schema, index (text and TFRecord)
    read(location, format, start, stop, ...) -> Iterator[Batch]

A shard's `read` of a CSV, JSON Lines or TFRecord file takes the `FileInfo` its transform's
`inspect` gave (`info`, kept as JSON: `FileInfo.to_json`, `info_from_json`) so it starts at its
first record's offset; without it the file is inspected again (scanned once more).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tffleet.datasets import npy, parquet, text, tfrecord
from tffleet.datasets.base import Batch, Column, FileInfo, RecordIndex
from tffleet.datasets.locations import Location

INPUT_FORMATS = ("parquet", "tfrecord", "csv", "jsonl", "npy")
OUTPUT_FORMATS = ("parquet", "jsonl", "npy")
# What a file's name says its format is, when a transform does not say.
SUFFIXES = {
    ".parquet": "parquet",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".npy": "npy",
}


def check_format(format: str, *, output: bool = False) -> str:
    """`format` if it is one of the input (or output) formats, else a ValueError naming them."""
    allowed = OUTPUT_FORMATS if output else INPUT_FORMATS
    if format not in allowed:
        raise ValueError(f"format {format!r}: expected one of {', '.join(allowed)}")
    return format


def format_of(uri: str) -> str | None:
    """The format a file's name says (None: it says none)."""
    name = uri.rsplit("/", 1)[-1].lower()
    for suffix, format in SUFFIXES.items():
        if name.endswith(suffix):
            return format
    return None


def inspect(location: Location, format: str) -> FileInfo:
    """Records and schema, read as little as the format allows: Parquet's footer, an .npy's
    header, a scan of TFRecord frames' lengths or of text's newlines (kept as an index)."""
    check_format(format)
    if format == "parquet":
        return parquet.inspect(location)
    if format == "npy":
        return npy.inspect(location)
    if format == "tfrecord":
        return tfrecord.inspect(location)
    return text.inspect_csv(location) if format == "csv" else text.inspect_jsonl(location)


def read(
    location: Location,
    format: str,
    start: int,
    stop: int,
    columns: list[str] | None = None,
    batch_records: int = 1024,
    *,
    key: str | None = None,
    info: FileInfo | None = None,
) -> Iterator[Batch]:
    """Records `[start, stop)` in batches of `batch_records` records read (good and bad: a
    batch holds fewer rows when some were bad), in order; `columns` (None: all) and the `key`
    column. A bad record is in its batch's `errors`; a file that cannot be read at all is a
    DatasetError; the store's faults are ObjectMissing / StoreUnavailable."""
    check_format(format)
    if batch_records < 1:
        raise ValueError(f"batch_records {batch_records}: at least 1")
    if format == "parquet":
        return parquet.read(location, start, stop, columns, batch_records, key=key)
    if format == "npy":
        return npy.read(location, start, stop, columns, batch_records, key=key)
    info = info if info is not None and info.index is not None else inspect(location, format)
    if format == "tfrecord":
        return tfrecord.read(location, start, stop, columns, batch_records, info=info, key=key)
    return text.read(
        location, start, stop, columns, batch_records, format=format, info=info, key=key
    )


def info_from_json(data: dict[str, Any]) -> FileInfo:
    """A FileInfo kept as JSON (`FileInfo.to_json`) back."""
    return FileInfo(
        records=int(data["records"]),
        schema={
            name: Column(column["dtype"], tuple(column["shape"]))
            for name, column in data["schema"].items()
        },
        index=RecordIndex.from_json(data["index"]) if data.get("index") else None,
    )
