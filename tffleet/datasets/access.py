"""Reading and writing a dataset's objects by parts: byte ranges, a sequential scan in windows, a
seekable file for pyarrow, and a writer that leaves the object whole or absent.

Each goes through `ObjectStore`'s ranged reads (`get_range`) and writer (`open_writer`), whose
errors are `ObjectMissing` and `StoreUnavailable`; an object missing is named by its location's
URI, as the transform asked for it, not by the store's key.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tffleet.datasets.locations import Location
from tffleet.objectstore import ObjectMissing

# A sequential scan's window and a reader's buffer: large enough that an S3 read costs its
# bytes, not its round trip.
WINDOW_BYTES = 8 * 1024 * 1024


@contextmanager
def _named(location: Location) -> Iterator[None]:
    """An object missing named by the location's URI."""
    try:
        yield
    except ObjectMissing:
        raise ObjectMissing(location.uri) from None


def size(location: Location) -> int:
    found = location.store.size(location.key)
    if found is None:
        raise ObjectMissing(location.uri)
    return found


def read_range(location: Location, start: int, end: int) -> bytes:
    """The bytes `[start, end)` of the object (fewer at its end)."""
    if end <= start:
        return b""
    with _named(location):
        return bytes(location.store.get_range(location.key, start, end))


def windows(
    location: Location, start: int, end: int, window: int = WINDOW_BYTES
) -> Iterator[bytes]:
    """The bytes `[start, end)` in windows of at most `window` bytes, one ranged read each: what
    a scan holds at once is one window, whatever the file's size."""
    offset = start
    while offset < end:
        chunk = read_range(location, offset, min(end, offset + window))
        if not chunk:
            return
        yield chunk
        offset += len(chunk)


class RangedFile(io.RawIOBase):
    """A seekable, read-only file over an object whose reads are ranged (pyarrow reads a
    Parquet footer and the column chunks it needs through it, never the whole object)."""

    def __init__(self, location: Location) -> None:
        super().__init__()
        self.location = location
        self.size = size(location)
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def read(self, length: int = -1) -> bytes:
        end = self.size if length is None or length < 0 else min(self.size, self.position + length)
        data = read_range(self.location, self.position, end)
        self.position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def open_file(location: Location) -> Any:
    """A pyarrow file over the object (see `RangedFile`), unbuffered: pyarrow asks for what it
    needs (the footer, a column chunk) in reads of their size, one ranged read each."""
    import pyarrow as pa

    return pa.PythonFile(RangedFile(location), mode="r")


@contextmanager
def writer(location: Location) -> Iterator[Any]:
    """A file to write the object through: on S3 a multipart upload completed when the block
    ends, on a directory a temporary file renamed into place then; an exception in the block
    aborts it, leaving no object (and any earlier one under the key as it was)."""
    with _named(location), location.store.open_writer(location.key) as file:
        yield _Sink(file)


class _Sink(io.RawIOBase):
    """An obstore writer as a Python file (pyarrow's `PythonFile` asks for `closed`, `flush`)."""

    def __init__(self, file: Any) -> None:
        super().__init__()
        self._file = file

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._file.write(view)
        return len(view)
