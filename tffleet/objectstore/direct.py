"""Big objects of a directory store written straight to the disk (O_DIRECT), not through the
page cache: `Direct` says why. tffleet/objectstore/files.py writes through it.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Sequence

# The size of the aligned buffers the chunks are copied into, or a body read into: one `write`
# each, from a thread. 4 MiB, not 2: half the hops to that thread and the socket's pauses and
# resumes (bench.objects (1), two runs each way: the .npy body 11.4-11.8 ms of the API's CPU
# against 11.8-12.1).
BUFFER_BYTES = 4 * 1024 * 1024

# Direct I/O's unit: offsets, lengths and buffer addresses a multiple of it (a device's logical
# block, 512 or 4096 bytes; a page-aligned buffer of whole pages suits both).
DIRECT_ALIGN = 4096
O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux's; elsewhere objects go through the page cache
# Aligned buffers kept for the next object (at most this many: BUFFER_BYTES each).
_KEPT_BUFFERS = 4
_buffers: list[mmap.mmap] = []
_buffers_lock = threading.Lock()


class Direct:
    """A file opened with O_DIRECT, written from an aligned buffer (BUFFER_BYTES, one of a few
    the process keeps, so its pages are in memory already) that the chunks are copied into, or
    that a body is read into (`space`, `took`): the device reads the buffer itself. Written
    through the page cache, each 4 KiB of a new object takes a fresh page, which the kernel must
    find, zero and account for, and which a virtual machine's host lends slowly: here 32-55 ms
    of kernel CPU per 12.6 MB object, against 3 this way and 2-3 more for its reader to map it
    from the disk (files.py `read`). The API's CPU per upload in bench.objects' `tffleet.Client`
    round went from 54-68 ms to 25-30. MinIO writes its big objects with O_DIRECT too. The last
    block is written padded to DIRECT_ALIGN and the file cut to its size; a device that refuses
    direct writes after all (EINVAL) gets the rest through the page cache."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._size = 0  # bytes taken, written or in the buffer
        self._fill = 0  # of which in the buffer
        with _buffers_lock:
            self._buffer = _buffers.pop() if _buffers else mmap.mmap(-1, BUFFER_BYTES)

    def write(self, buffers: Sequence[bytes | memoryview]) -> None:
        room = len(self._buffer)
        for buffer in buffers:
            view = memoryview(buffer).cast("B")
            while view:
                take = min(len(view), room - self._fill)
                self._buffer[self._fill : self._fill + take] = view[:take]
                self._fill += take
                self._size += take
                view = view[take:]
                if self._fill == room:
                    self._flush(room)

    def space(self) -> memoryview:
        """The buffer's free part, to read bytes into; `took` says how many came."""
        return memoryview(self._buffer)[self._fill :]

    def took(self, nbytes: int) -> bool:
        """`nbytes` were read into `space()`; whether the buffer is full (`flush` it then)."""
        self._fill += nbytes
        self._size += nbytes
        return self._fill == len(self._buffer)

    def flush(self) -> None:
        """Write the full buffer (from a thread: the call waits for the device)."""
        self._flush(len(self._buffer))

    @property
    def size(self) -> int:
        return self._size

    def close(self) -> None:
        """Write what the buffer holds (padded to a block), cut the file to its size."""
        if self._fill:
            self._flush(-(-self._fill // DIRECT_ALIGN) * DIRECT_ALIGN)
            os.ftruncate(self._fd, self._size)
        self.release()

    def release(self) -> None:
        with _buffers_lock:
            if len(_buffers) < _KEPT_BUFFERS:
                _buffers.append(self._buffer)

    def _flush(self, length: int) -> None:
        with memoryview(self._buffer) as whole:
            done = 0
            while done < length:
                try:
                    done += os.write(self._fd, whole[done:length])
                except OSError as exc:
                    flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
                    if exc.errno != errno.EINVAL or not flags & O_DIRECT:
                        raise
                    # A device that takes no direct writes after all: the page cache, then.
                    fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~O_DIRECT)
        self._fill = 0
