"""Job ids: UUIDv7, so that ids sort by submission time.

A job's "age" in the claim order, a listing's cursor and the sweeper's "oldest first" all compare
ids, so ids made by one process must grow strictly, even within a millisecond.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from tffleet.errors import InvalidRequest

_id_lock = threading.Lock()
_id_last = (0, 0)  # (unix ms, 74 random-or-counter bits) of the last id this process made


def _reset_ids_after_fork() -> None:
    # A forked child (Celery prefork, uvicorn workers) must not count on from its parent's last
    # id, where its siblings would count too; nor inherit a lock another thread held at the fork.
    global _id_lock, _id_last
    _id_lock = threading.Lock()
    _id_last = (0, 0)


os.register_at_fork(after_in_child=_reset_ids_after_fork)


def new_job_id() -> str:
    """A UUIDv7: 48 bits of Unix milliseconds, then 74 bits that grow within a millisecond.

    Ids sort by submission time, and within one process strictly by creation order (RFC 9562's
    monotonic random: a new millisecond draws fresh randomness, the same one adds to the last),
    so jobs submitted together keep their order wherever "age" means "id".
    """
    global _id_last
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, last_tail = _id_last
        if ms > last_ms:
            tail = int.from_bytes(os.urandom(10), "big") >> 7  # 73 bits: room to count up
        else:  # same millisecond, or the clock stepped back: stay after the last id
            ms = last_ms
            tail = last_tail + 1 + (int.from_bytes(os.urandom(4), "big") >> 8)
            if tail >= 1 << 74:
                ms, tail = ms + 1, int.from_bytes(os.urandom(10), "big") >> 7
        _id_last = (ms, tail)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= (tail >> 62) << 64  # 12 bits (rand_a)
    value |= 0x2 << 62  # RFC 4122 variant
    value |= tail & ((1 << 62) - 1)  # 62 bits (rand_b)
    return str(uuid.UUID(int=value))


def cursor_id(cursor: str) -> str:
    """The id a listing's `cursor` names, in canonical form: ids compare as strings, so "{...}",
    upper-case or unhyphenated spellings of the same UUID would page from the wrong place."""
    try:
        return str(uuid.UUID(cursor))
    except ValueError:
        raise InvalidRequest(f"cursor: {cursor!r} is not a cursor this API returned") from None
