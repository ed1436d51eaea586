"""A directory store's (`file://`) objects written and read without obstore.

obstore's writer takes one call, and a hop to its runtime's threads and back, per chunk: a
12.6 MB body in uvicorn's 64 KiB chunks cost 14 ms of CPU that way, 4 ms written here. An object
of BATCH_BYTES or more goes straight to the disk, not through the page cache (direct.py says
why); its reader's fetch reads it back (`read`). A stream that can be read into a buffer of
ours (`Readable`: an HTTP body, api/httpserver.py) is, a big one straight into the aligned
buffer that goes to the disk: no copy of its bytes at all on our side. The file is laid out as
obstore's LocalStore lays out its own (the key's path under the root, a staging file
`<name>#<id>` beside it that its listings skip, renamed into place once whole), so every other
call reads it through obstore as if obstore had written it.

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
import errno
import mmap
import os
import re
import threading
import uuid
import weakref
from collections.abc import AsyncIterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from tffleet.objectstore.direct import O_DIRECT, Direct

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


@runtime_checkable
class Readable(AsyncIterable[bytes], Protocol):
    """A stream of `size` bytes that can be read into a buffer of the writer's, besides being
    iterated in chunks (where `readable()` says no, or the object is small)."""

    size: int

    def readable(self) -> bool: ...

    async def readinto(self, buffer: memoryview) -> int:
        """Fill the buffer with the next bytes; how many (0: the end)."""
        ...


class _StagedFile:
    """A directory store's object written as obstore's LocalStore writes one: into a staging
    file beside it (`<name>#<id>`, which its listings skip), renamed into place once whole, so
    no reader sees part of it. Its calls run in threads; `abandon` (on the event loop, after a
    cancellation, say) waits for a call in flight before it closes the file, whose number
    would otherwise be free for another file while that write still goes on, and a call that
    starts after it does nothing.

    An object written in more than one call (`write` before `commit`: BATCH_BYTES or more) goes
    to the disk directly (O_DIRECT), not through the page cache: see direct.py. One written
    whole by `commit` alone, a small one, is written as any file is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.staging = path.with_name(f"{path.name}#{uuid.uuid4().hex}")
        self._fd: int | None = None
        self._direct: Direct | None = None
        self._abandoned = False
        self._lock = threading.Lock()

    def _open(self, *, direct: bool) -> int:
        if self._fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            if direct and O_DIRECT:
                try:
                    self._fd = self._create(flags | O_DIRECT)
                except OSError as exc:  # a file system without direct I/O (tmpfs)
                    if exc.errno != errno.EINVAL:
                        raise
                else:
                    self._direct = Direct(self._fd)
            if self._fd is None:
                self._fd = self._create(flags)
        return self._fd

    def _create(self, flags: int) -> int:
        try:
            return os.open(self.staging, flags, 0o666)  # the mode as LocalStore's: less the umask
        except FileNotFoundError:  # the first object in its folder
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.staging, flags, 0o666)

    def write(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Write the buffers whole, the file opened first if this is its first write."""
        with self._lock:
            if self._abandoned:
                return
            self._write(self._open(direct=True), buffers)

    def _write(self, fd: int, buffers: Sequence[bytes | memoryview]) -> None:
        if self._direct is not None:
            self._direct.write(buffers)
            return
        views = [memoryview(buffer) for buffer in buffers]
        while views:  # `writev` may write less than asked
            done = os.writev(fd, views)
            while views and done >= len(views[0]):
                done -= len(views.pop(0))
            if done:
                views[0] = views[0][done:]

    def open_direct(self) -> Direct | None:
        """Open the file for direct writes, its bytes then read into `Direct.space()`; None
        where the file system takes no direct I/O (the chunks are written, then)."""
        with self._lock:
            self._open(direct=True)
            return self._direct

    def flush(self) -> None:
        """Write the direct buffer, full (`Direct.took` said so)."""
        with self._lock:
            if not self._abandoned and self._direct is not None:
                self._direct.flush()

    def commit(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Write the last buffers, then put the file in place."""
        with self._lock:
            if self._abandoned:
                return
            fd = self._open(direct=False)
            self._write(fd, buffers)
            if self._direct is not None:
                self._direct.close()
                self._direct = None
            self._fd = None
            os.close(fd)
            os.replace(self.staging, self.path)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            if self._direct is not None:
                self._direct.release()
                self._direct = None
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
            with contextlib.suppress(OSError):
                self.staging.unlink()


async def write_stream(path: Path, chunks: AsyncIterable[bytes]) -> int:
    """Write the chunks to `path` as they come, gathered (not copied) into batches of
    BATCH_BYTES, each written in a thread (a big object's straight to the disk: direct.py), or
    a big `Readable` read into the direct buffer itself; returns the bytes written. An error
    (the chunks' own, or the file system's OSError) leaves nothing under `path`."""
    staged, written = _StagedFile(path), 0
    try:
        if isinstance(chunks, Readable) and chunks.size >= BATCH_BYTES and chunks.readable():
            direct = await asyncio.to_thread(staged.open_direct)
            if direct is not None:
                return await _read_into(staged, direct, chunks)
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


async def _read_into(staged: _StagedFile, direct: Direct, body: Readable) -> int:
    """Read the body into the direct buffer (on the event loop: the kernel copies from the
    socket into it) and write it each time it is full (in a thread), then the rest."""
    while True:
        got = await body.readinto(direct.space())
        if not got:
            break
        if direct.took(got):
            await asyncio.to_thread(staged.flush)
    await asyncio.to_thread(staged.commit, [])
    return direct.size


def write(path: Path, data: bytes | memoryview) -> None:
    """Write `data` to `path` as `write_stream` writes a stream: in place once whole, a big
    object (BATCH_BYTES or more) straight to the disk. An error leaves nothing under `path`."""
    staged = _StagedFile(path)
    try:
        if memoryview(data).nbytes >= BATCH_BYTES:
            staged.write([data])
            staged.commit([])
        else:
            staged.commit([data])
    except BaseException:
        staged.abandon()
        raise


def read(path: Path, start: int = 0, end: int | None = None) -> memoryview:
    """Bytes `start` to `end` (None: all; past the end: to there) of a directory store's
    object: a view of a private memory map of the file where they are MAP_MIN_BYTES or more
    (written, it changes the reader's copy alone), else the bytes read. FileNotFoundError when
    there is none. A map's pages are read and mapped before it returns (`_populated`), so a
    forward pass that reads it later waits for no disk and takes no page faults."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else max(0, min(end, size))
        start = min(max(0, start), end)
        if end - start >= MAP_MIN_BYTES:  # a few bytes of a big file, a header say, are read
            mapped = _mapped(fd, size)
            if mapped is not None:
                _populated(mapped, start, end)
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


# madvise's "fault these pages in now, for reading" (Linux 5.14 and later).
_MADV_POPULATE_READ = 22


def _populated(mapped: mmap.mmap, start: int, end: int) -> None:
    """Bytes `start` to `end` of the map read from the file where the page cache lacks them,
    and mapped, in one call: the worker fetches a batch's objects while the device runs the one
    before (worker/objects.py), and this is where their cost falls, not on the threads of the
    forward pass (a page fault each 64 KiB; a disk read each, stalling them, for an object
    written straight to the disk and not yet read back). A kernel without it maps nothing ahead."""
    first = start - start % mmap.PAGESIZE
    with contextlib.suppress(OSError):  # EINVAL: a kernel before 5.14
        mapped.madvise(_MADV_POPULATE_READ, first, end - first)


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
