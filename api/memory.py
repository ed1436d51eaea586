"""The API process's heap: freed memory kept for the next large body, not handed back; the
objects made at startup left out of the garbage collector's full passes (`freeze_startup`).

A 12.6 MB body arrives as uvicorn's chunks of up to 256 KiB, each copied into a fresh buffer.
glibc's malloc serves blocks that large from `mmap` and gives the memory back to the kernel once
freed (its heap trimmed above 128 KiB free), so each chunk's pages were faulted in and zeroed
anew: 12 ms of kernel time per body, against 2 for the copies themselves (uvicorn alone taking
12.6 MB bodies: 14.5 ms of CPU a body, 4.7 with `keep_freed_memory`). Blocks under
MMAP_THRESHOLD come from the heap instead, and up to TRIM_THRESHOLD of free heap is kept: the
process's resident size stays up to that much above its live data after a large request. (A
threshold of 8 MiB made a 16.8 MB JSON job cost 90 ms instead of 55: its buffers mapped anew.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

# mallopt's parameters (malloc.h) and the values set.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 128 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (see the module docstring); False where the C library is not
    glibc (musl, macOS), which is left as it is."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not done:
        log.debug("mallopt refused the thresholds: the heap is left as it is")
    return done


_frozen = False


def freeze_startup() -> None:
    """Once per process, at the end of startup: collect, then move every object alive now (the
    modules, the app and its routes, the database engine) out of the collector's view
    (`gc.freeze`). Its full passes walked them all: one 76 ms pass in every hundred 12.6 MB jobs
    here, 0.76 ms a job and a 76 ms stall of the event loop. They live as long as the process,
    so nothing is lost by never looking at them again."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
