"""`.npy` files: one array whose first axis is the records, its one column named `array`.

`inspect` reads the header alone; a shard reads its rows' bytes as one range per batch (an
array's rows are fixed-size, so a record's offset is arithmetic, no index needed).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import numpy as np

from tffleet.datasets import access
from tffleet.datasets.base import Batch, Column, DatasetError, FileInfo, check_range
from tffleet.datasets.locations import Location

# The name of an .npy file's one column (a model of one input takes it without a mapping).
COLUMN = "array"
_MAGIC = b"\x93NUMPY"
# Headers are padded to a multiple of 64 bytes; this covers any real one in one read.
_HEADER_READ = 4096


def _header(location: Location) -> tuple[np.dtype, tuple[int, ...], int]:
    """The array's dtype, shape and where its data starts."""
    head = access.read_range(location, 0, _HEADER_READ)
    if not head.startswith(_MAGIC) or len(head) < 10:
        raise DatasetError(f"{location.uri}: not an .npy file (no \\x93NUMPY magic)")
    major = head[6]
    width = 2 if major == 1 else 4
    length = int.from_bytes(head[8 : 8 + width], "little")
    start = 8 + width
    text = head[start : start + length]
    if len(text) < length:
        text = access.read_range(location, start, start + length)
    try:
        header = ast.literal_eval(text.decode("latin1"))
        dtype = np.dtype(header["descr"])
        shape = tuple(int(n) for n in header["shape"])
        fortran = bool(header["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise DatasetError(f"{location.uri}: an .npy header that does not parse ({exc})") from None
    if dtype.hasobject or dtype.fields is not None:
        raise DatasetError(f"{location.uri}: an .npy of {dtype} (objects or records) is not read")
    if fortran and len(shape) > 1:
        raise DatasetError(f"{location.uri}: a Fortran-order .npy is not read (save it C-order)")
    if not shape:
        raise DatasetError(f"{location.uri}: a 0-d .npy holds no records")
    return dtype, shape, start + length


def _name(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "SU" else dtype.name


def inspect(location: Location) -> FileInfo:
    dtype, shape, _ = _header(location)
    return FileInfo(records=shape[0], schema={COLUMN: Column(_name(dtype), shape[1:])})


def read(
    location: Location,
    start: int,
    stop: int,
    columns: list[str] | None = None,
    batch_records: int = 1024,
    *,
    key: str | None = None,
) -> Iterator[Batch]:
    dtype, shape, data = _header(location)
    check_range(start, stop, shape[0])
    if key is not None:
        raise DatasetError(f"{location.uri}: an .npy has no key column ({key!r})")
    for name in columns or []:
        if name != COLUMN:
            raise DatasetError(f"{location.uri}: an .npy's one column is {COLUMN!r}, not {name!r}")
    row = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    for first in range(start, stop, batch_records):
        last = min(stop, first + batch_records)
        raw = access.read_range(location, data + first * row, data + last * row)
        if len(raw) != (last - first) * row:
            raise DatasetError(f"{location.uri}: shorter than its header says (truncated?)")
        array = np.frombuffer(raw, dtype=dtype).reshape((last - first, *shape[1:]))
        yield Batch(columns={COLUMN: array}, index=np.arange(first, last, dtype=np.int64))
