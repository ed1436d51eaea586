"""bench.soak's tracer, on the fleet's PYTHONPATH only when TFFLEET_SOAK_TRACE=DIR is set.

Every TFFLEET_SOAK_TRACE_S (60) seconds each Python process of the fleet, its forked children
too, writes DIR/PID-N.txt: its gc objects counted by type (the 40 commonest, with the change
since its first count; the types grown most since its last). With TFFLEET_SOAK_TRACEMALLOC=1,
tracemalloc starts at the first count (after start-up, which it would slow several times) in
the processes whose command line holds TFFLEET_SOAK_TRACE_ONLY (default: all; `worker` for the
worker's), and each file adds the largest differences by line since the last and the first
snapshots, and the tracebacks of the five largest since the last. Not part of tffleet: a
bench's instrument.
"""

from __future__ import annotations

import collections
import gc
import os
import threading
import tracemalloc
from pathlib import Path

_DIR = os.environ.get("TFFLEET_SOAK_TRACE")
_EVERY = float(os.environ.get("TFFLEET_SOAK_TRACE_S", "60"))
_MALLOC = os.environ.get("TFFLEET_SOAK_TRACEMALLOC") == "1"
_ONLY = os.environ.get("TFFLEET_SOAK_TRACE_ONLY", "")


def _counts() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def _traced() -> bool:
    if not _MALLOC:
        return False
    try:
        cmdline = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return _ONLY in cmdline


def _loop() -> None:
    out = Path(_DIR or ".")
    out.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    stop = threading.Event()
    if stop.wait(_EVERY):
        return
    first_counts = last_counts = _counts()
    first_snap = last_snap = None
    if _traced():
        tracemalloc.start(12)
        first_snap = last_snap = tracemalloc.take_snapshot()
    n = 0
    while not stop.wait(_EVERY):
        n += 1
        counts = _counts()
        lines = [f"pid {pid} sample {n}", "", "gc objects: type count change"]
        for name, count in counts.most_common(40):
            lines.append(f"{name:40s} {count:9d} {count - first_counts.get(name, 0):+8d}")
        grown = sorted(((c - last_counts.get(k, 0), k) for k, c in counts.items()), reverse=True)
        lines += ["", "most grown types since the last sample"]
        lines += [f"{k:40s} {d:+8d}" for d, k in grown[:25]]
        last_counts = counts
        if first_snap is not None and last_snap is not None:
            snap = tracemalloc.take_snapshot()
            lines += ["", "tracemalloc: largest growth by line since the last sample"]
            lines += [str(s) for s in snap.compare_to(last_snap, "lineno")[:15]]
            lines += ["", "tracemalloc: largest growth by line since the first sample"]
            lines += [str(s) for s in snap.compare_to(first_snap, "lineno")[:25]]
            for stat in snap.compare_to(last_snap, "traceback")[:5]:
                lines += ["", f"traceback of {stat}", *stat.traceback.format()]
            last_snap = snap
        (out / f"{pid}-{n}.txt").write_text("\n".join(lines) + "\n")


def _start() -> None:
    threading.Thread(target=_loop, name="soak-trace", daemon=True).start()


if _DIR:
    _start()
    os.register_at_fork(after_in_child=_start)
