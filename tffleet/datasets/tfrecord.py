"""TFRecord files of `tf.train.Example`, read without TensorFlow.

A TFRecord file is a sequence of frames: the record's length (uint64, little-endian), a masked
CRC-32C of those 8 bytes, the record, a masked CRC-32C of the record. `inspect` walks the
lengths from frame to frame (checking each length's CRC: a broken frame is a broken file, there
is no next record to find) and keeps every `INDEX_EVERY`-th frame's offset; a shard's `read`
starts at the frame sampled at or before its first record. The records' own CRCs are not checked
here (pure Python would be slow): a damaged record fails to parse as an Example and is reported
as a bad record. A feature's values are flat lists (`bytes_list`: strings, `float_list`: float32,
`int64_list`: int64): its column has shape (n,), or (-1,) when n varies among the first records.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from functools import lru_cache

import numpy as np

from tffleet.datasets import access, example
from tffleet.datasets.base import (
    Batch,
    Column,
    DatasetError,
    FileInfo,
    IndexBuilder,
    check_range,
    parsed_batches,
    selected,
)
from tffleet.datasets.locations import Location

SAMPLE_RECORDS = 100
_HEADER = 12  # length and its CRC
_FRAME = 16  # header and the record's CRC


@lru_cache(maxsize=1)
def _table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of `data`."""
    table, crc = _table(), 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record framed as TFRecord writes it (for tests, and writers without TensorFlow)."""
    length = struct.pack("<Q", len(record))
    return b"".join(
        (
            length,
            struct.pack("<I", masked_crc(length)),
            record,
            struct.pack("<I", masked_crc(record)),
        )
    )


def _length(header: bytes, at: int, location: Location) -> int:
    if len(header) < _HEADER:
        raise DatasetError(f"{location.uri}: truncated at byte {at} (a frame's header is cut)")
    (length,), (crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:12])
    if masked_crc(header[:8]) != crc:
        raise DatasetError(f"{location.uri}: a corrupt frame at byte {at} (its length's CRC)")
    return int(length)


def _index(location: Location) -> tuple[IndexBuilder, int]:
    """Every frame's offset, found by its header alone: windows of the file where records are
    small, one header read per frame where they are large (their bytes are never read)."""
    size, builder = access.size(location), IndexBuilder()
    buffer, buffer_at, position, length = b"", 0, 0, 0
    while position < size:
        if position + _HEADER > buffer_at + len(buffer):
            span = _HEADER if length > access.WINDOW_BYTES // 8 else access.WINDOW_BYTES
            buffer, buffer_at = (
                access.read_range(location, position, min(size, position + span)),
                position,
            )
        at = position - buffer_at
        length = _length(buffer[at : at + _HEADER], position, location)
        builder.add(position)
        position += _FRAME + length
    if position != size:
        raise DatasetError(f"{location.uri}: truncated (its last record ends past the file)")
    return builder, size


def records(location: Location, begin: int, end: int) -> Iterator[bytes]:
    """The records of the frames in `[begin, end)` (begin at a frame), read in windows."""
    buffer = b""
    for chunk in access.windows(location, begin, end):
        buffer = buffer + chunk if buffer else chunk
        at = 0
        while len(buffer) - at >= _HEADER:
            (length,) = struct.unpack_from("<Q", buffer, at)
            if len(buffer) - at < _FRAME + length:
                break
            yield buffer[at + _HEADER : at + _HEADER + length]
            at += _FRAME + length
        buffer = buffer[at:]
    if buffer:
        raise DatasetError(f"{location.uri}: truncated (a frame is cut at its end)")


def inspect(location: Location) -> FileInfo:
    builder, size = _index(location)
    index = builder.build(size)
    sample: dict[str, list[np.ndarray]] = {}
    for record in records(location, 0, index.end_of(SAMPLE_RECORDS)):
        try:
            features = example.decode(record)
        except ValueError:
            continue
        for name, values in features.items():
            sample.setdefault(name, []).append(values)
    schema = {}
    for name, found in sample.items():
        kinds = {example.kind_of(v) for v in found if len(v)}
        lengths = {len(v) for v in found}
        dtype = kinds.pop() if len(kinds) == 1 else "float32"
        schema[name] = Column(dtype, (lengths.pop() if len(lengths) == 1 else -1,))
    return FileInfo(records=builder.records, schema=schema, index=index)


def read(
    location: Location,
    start: int,
    stop: int,
    columns: list[str] | None,
    batch_records: int = 1024,
    *,
    info: FileInfo,
    key: str | None = None,
) -> Iterator[Batch]:
    """Records `[start, stop)` in batches, decoded; a record that is no Example, lacks a
    feature, or whose feature has another kind or length than its column is a bad record."""
    check_range(start, stop, info.records)
    names, wanted = selected(
        location.uri, columns, key, every=info.schema, has=sorted(info.schema), what="feature"
    )
    assert info.index is not None
    number, begin = info.index.start_of(start)
    yield from parsed_batches(
        records(location, begin, info.index.end_of(stop)),
        number,
        (start, stop),
        lambda record: _pick(record, wanted, info.schema),
        (ValueError,),
        batch_records=batch_records,
        names=names,
        key=key,
        schema=info.schema,
    )


def _pick(record: bytes, wanted: list[str], schema: dict[str, Column]) -> dict[str, np.ndarray]:
    features = example.decode(record)
    picked = {}
    for name in wanted:
        values = features.get(name)
        column = schema[name]
        if values is None:
            raise ValueError(f"feature {name!r} is missing")
        if len(values) and example.kind_of(values) != column.dtype:
            raise ValueError(
                f"feature {name!r}: {example.kind_of(values)}, expected {column.dtype}"
            )
        if column.shape[0] not in (-1, len(values)):
            raise ValueError(f"feature {name!r}: {len(values)} values, expected {column.shape[0]}")
        picked[name] = values
    return picked
