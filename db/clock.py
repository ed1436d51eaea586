"""The clock the database layer writes: aware UTC datetimes (stored naive: `UTCDateTime`)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
