"""A directory store's (`file://`) streams written, and its objects read, without obstore.

obstore's writer takes one call, and a hop to its runtime's threads and back, per chunk: a
12.6 MB body in uvicorn's 64 KiB chunks cost 14 ms of CPU that way, 4 ms written here (the
kernel's copy into the page cache, most of it). The file is laid out as obstore's LocalStore
lays out its own (the key's path under the root, a staging file `<name>#<id>` beside it that
its listings skip, renamed into place once whole), so every other call reads it through
obstore as if obstore had written it.

Reads (`read`): MAP_MIN_BYTES or more of an object are memory-mapped, not read: the buffer is
the page cache's own pages, so a worker's 12.6 MB input costs no copy, no fresh memory zeroed
and faulted in, and no memset (obstore's read does all three: 1.5 ms of CPU per 12.6 MB read
alone, 3 to 7 ms per job in a busy worker's store thread; mapped and every page touched, 0.06
ms). Objects are never changed in place (written beside and renamed, as above), and a mapping
outlives the file's deletion, so a reader never sees an object change under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import re
import threading
import uuid
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

# The chunks are written in batches of about this many bytes, one `writev` in a thread each:
# few hops, and a request holds no more than this of its body.
BATCH_BYTES = 2 * 1024 * 1024
# ... or of this many chunks, well under the most one `writev` takes (IOV_MAX, 1024 on Linux).
BATCH_CHUNKS = 256
# Reads of at least this many bytes are of a memory map (`read`), smaller ones by a `pread`: a
# map costs two more system calls and holds a file descriptor as long as its buffer lives.
MAP_MIN_BYTES = 1024 * 1024
# At most this many maps live at once in a process (past it, objects are read): a batch of many
# big objects must not take the descriptors its database connections and sockets need.
MAX_MAPS = 256
# Keys that LocalStore keeps under the same path on disk (it escapes other characters): those
# `keys` makes. Others go through obstore's writer.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.:-]+(/[A-Za-z0-9_.:-]+)*")


def plain(key: str) -> bool:
    """Whether `key` is written here: its path on disk is itself, climbing out of nothing."""
    return _PLAIN_KEY.fullmatch(key) is not None and ".." not in key.split("/")


class _StagedFile:
    """A directory store's object written as obstore's LocalStore writes one: into a staging
    file beside it (`<name>#<id>`, which its listings skip), renamed into place once whole, so
    no reader sees part of it. Its calls run in threads; `abandon` (on the event loop, after a
    cancellation, say) waits for a call in flight before it closes the file, whose number
    would otherwise be free for another file while that write still goes on, and a call that
    starts after it does nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.staging = path.with_name(f"{path.name}#{uuid.uuid4().hex}")
        self._fd: int | None = None
        self._abandoned = False
        self._lock = threading.Lock()

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            self._fd = os.open(self.staging, flags, 0o666)  # as LocalStore's: less the umask
        return self._fd

    def write(self, buffers: list[bytes]) -> None:
        """Write the buffers whole (`writev` may write less than asked), the file opened first
        if this is its first write."""
        with self._lock:
            if self._abandoned:
                return
            self._write(buffers)

    def _write(self, buffers: list[bytes]) -> None:
        fd = self._open()
        views = [memoryview(buffer) for buffer in buffers]
        while views:
            done = os.writev(fd, views)
            while views and done >= len(views[0]):
                done -= len(views.pop(0))
            if done:
                views[0] = views[0][done:]

    def commit(self, buffers: list[bytes]) -> None:
        """Write the last buffers, then put the file in place."""
        with self._lock:
            if self._abandoned:
                return
            self._write(buffers)
            fd, self._fd = self._fd, None
            assert fd is not None
            os.close(fd)
            os.replace(self.staging, self.path)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
            with contextlib.suppress(OSError):
                self.staging.unlink()


async def write_stream(path: Path, chunks: AsyncIterator[bytes]) -> int:
    """Write the chunks to `path` as they come, gathered (not copied) into batches of
    BATCH_BYTES, each written by one `writev` in a thread; returns the bytes written. An error
    (the chunks' own, or the file system's OSError) leaves nothing under `path`."""
    staged, written = _StagedFile(path), 0
    try:
        batch: list[bytes] = []
        size = 0
        async for chunk in chunks:
            batch.append(chunk)
            size += len(chunk)
            if size >= BATCH_BYTES or len(batch) >= BATCH_CHUNKS:
                await asyncio.to_thread(staged.write, batch)
                written, batch, size = written + size, [], 0
        await asyncio.to_thread(staged.commit, batch)
        written += size
    except BaseException:
        staged.abandon()
        raise
    return written


def read(path: Path, start: int = 0, end: int | None = None) -> memoryview:
    """Bytes `start` to `end` (None: all; past the end: to there) of a directory store's
    object: a view of a private memory map of the file where they are MAP_MIN_BYTES or more
    (read by nothing until used; written, it changes the reader's copy alone), else the bytes
    read. FileNotFoundError when there is none."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else max(0, min(end, size))
        start = min(max(0, start), end)
        if end - start >= MAP_MIN_BYTES:  # a few bytes of a big file, a header say, are read
            mapped = _mapped(fd, size)
            if mapped is not None:
                return memoryview(mapped)[start:end]
        data = os.pread(fd, end - start, start)
        while len(data) < end - start:  # a regular file reads short only at its end
            more = os.pread(fd, end - start - len(data), start + len(data))
            if not more:
                break
            data += more
        return memoryview(data)
    finally:
        os.close(fd)


_maps = 0  # live in this process (`_mapped`)
_maps_lock = threading.Lock()


def _mapped(fd: int, size: int) -> mmap.mmap | None:
    """A private (copy-on-write) map of the file: what a reader writes, TensorFlow say, where it
    takes the memory as its own (worker/runtime/feed.py), never reaches the file. It keeps a
    descriptor of its own (Python's mmap dups it) until no buffer holds it. None where MAX_MAPS
    live already, or the file system maps nothing: the caller reads the file instead."""
    global _maps
    with _maps_lock:
        if _maps >= MAX_MAPS:
            return None
        _maps += 1
    try:
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except OSError:  # out of descriptors or maps, a file system that maps nothing
        _unmapped()
        return None
    weakref.finalize(mapped, _unmapped)
    return mapped


def _unmapped() -> None:
    global _maps
    with _maps_lock:
        _maps -= 1
