"""The `Cancel-After` header: how long a job may take, from its submit (or retry), to end; and
`Queue-Timeout`: how long it may wait for a worker to start it.

Seconds (`30`, `1.5`) or a Go-style duration (`90s`, `5m`, `1h30m`, `250ms`): what a web app's
own request timeout is usually written as. A job not ended (or not started) by then is canceled
(db.jobs), with error `deadline` (`queue_timeout`).
"""

from __future__ import annotations

import math
import re

from tffleet.errors import InvalidInput

HEADER = "Cancel-After"
QUEUE_TIMEOUT_HEADER = "Queue-Timeout"

# At most what a job's retention may be (`ttl_s`): a longer deadline means none. The same bound
# for a queue time-out.
MAX_CANCEL_AFTER_S = 366 * 24 * 3600

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_SECONDS = re.compile(rf"^{_NUMBER}$")
_PART = re.compile(rf"({_NUMBER})(ns|us|µs|ms|s|m|h)")
_DURATION = re.compile(rf"^(?:{_NUMBER}(?:ns|us|µs|ms|s|m|h))+$")
_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # MICRO SIGN, as Go writes it (one byte in a latin-1 header)
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def cancel_after_s(header: str | None) -> float | None:
    """The `Cancel-After` header's value in seconds, None without one; 422 naming the header if
    it is not a positive duration of at most `MAX_CANCEL_AFTER_S`."""
    return duration_s(header, name=HEADER)


def queue_timeout_s(header: str | None) -> float | None:
    """The `Queue-Timeout` header's value in seconds, None without one; 422 naming the header
    as `cancel_after_s` does."""
    return duration_s(header, name=QUEUE_TIMEOUT_HEADER)


def duration_s(header: str | None, *, name: str) -> float | None:
    """A duration header's value in seconds, None without one; 422 naming the header (`name`)
    if it is not a positive duration of at most `MAX_CANCEL_AFTER_S`."""
    if header is None:
        return None
    value = header.strip()
    if _SECONDS.match(value):
        seconds = float(value)
    elif _DURATION.match(value):
        seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(value))
    else:
        raise InvalidInput(
            f"{name}: {header[:40]!r} is not a duration: give seconds (30, 1.5) or a Go-style "
            "duration (90s, 5m, 1h30m, 250ms)"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidInput(f"{name}: must be more than 0, got {header[:40]!r}")
    if seconds > MAX_CANCEL_AFTER_S:
        raise InvalidInput(
            f"{name}: at most {MAX_CANCEL_AFTER_S} seconds (366 days), got {header[:40]!r}"
        )
    return seconds
