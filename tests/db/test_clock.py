"""The fleet's clock is the database's (db/clock.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from db import clock


@pytest.fixture(autouse=True)
def _fresh_readings() -> None:
    clock.forget()


def test_now_is_the_databases_time_whatever_this_hosts_clock_says(
    engine: Engine, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessions() as session:
        if engine.dialect.name == "sqlite":  # a library in this process: its time is the host's
            before = clock.utcnow()
            assert before <= clock.now(session) <= clock.utcnow()
            return
        # Once the database's clock is read, this host's wall clock plays no part.
        real = clock.utcnow
        monkeypatch.setattr(clock, "utcnow", lambda: real() + timedelta(hours=1))
        now = clock.now(session)
        database = session.execute(text("SELECT clock_timestamp()")).scalar_one().astimezone(UTC)
        assert now.tzinfo is not None
        assert abs((database - now).total_seconds()) < 1


def test_a_reading_is_carried_forward_then_read_again(
    engine: Engine, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite's clock is never read: it is this host's")
    reads = 0
    read = clock._read

    def counted(session: Session) -> tuple[datetime, float]:
        nonlocal reads
        reads += 1
        return read(session)

    monkeypatch.setattr(clock, "_read", counted)
    with sessions() as session:
        first = clock.now(session)
        time.sleep(0.01)
        second = clock.now(session)
        assert reads == 1
        assert second > first  # carried forward by the monotonic clock
        monkeypatch.setattr(clock, "RESYNC_S", 0.0)
        clock.now(session)
        assert reads == 2
