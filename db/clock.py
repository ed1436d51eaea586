"""The fleet's clock is the database's: aware UTC datetimes (stored naive: `UTCDateTime`).

Leases, heartbeats, presence and wake-ups are written by one host and judged by another, so
they must not depend on which host's clock is right. `now(session)` is the database's time:

- PostgreSQL: read with `clock_timestamp()` at most once every `RESYNC_S` per process and
  database, then carried forward by this process's monotonic clock. A host whose wall clock is
  minutes off, or jumps, still writes the database's time; between reads the error is the
  drift of a monotonic clock over a minute (parts per million) plus half a round trip.
- SQLite: the database is a library in this process, and every process using the file runs on
  this machine; its time is this machine's.

`utcnow()` is this host's clock, for what no other host compares against.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

# How long a reading of the database's clock is carried forward before it is read again.
RESYNC_S = 60.0

_lock = threading.Lock()
# Per database (its URL): the database's time at one instant of this process's monotonic clock.
_readings: dict[str, tuple[datetime, float]] = {}


def utcnow() -> datetime:
    """This host's clock."""
    return datetime.now(UTC)


def now(session: Session) -> datetime:
    """The database's current time (see the module's docstring)."""
    bind = session.get_bind()
    if bind.dialect.name == "sqlite":
        return utcnow()
    engine = bind if isinstance(bind, Engine) else bind.engine
    key = engine.url.render_as_string(hide_password=True)
    mono = time.monotonic()
    with _lock:
        reading = _readings.get(key)
    if reading is None or mono - reading[1] >= RESYNC_S:
        reading = _read(session)
        with _lock:
            _readings[key] = reading
    at, read_at = reading
    return at + timedelta(seconds=time.monotonic() - read_at)


def _read(session: Session) -> tuple[datetime, float]:
    before = time.monotonic()
    value = session.execute(text("SELECT clock_timestamp()")).scalar_one()
    after = time.monotonic()
    # The database read its clock somewhere in the round trip: take the middle.
    return value.astimezone(UTC), (before + after) / 2


def forget() -> None:
    """Read every database's clock afresh on next use (tests)."""
    with _lock:
        _readings.clear()
