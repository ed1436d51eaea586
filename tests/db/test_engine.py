"""Engines: URL handling, SQLite's locking mode, and time stamps stored as UTC."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from db import engine as engine_module
from db.engine import WalCheckpointer, make_engine, normalize_url, readonly
from db.migrate import alembic_config
from db.models import Job


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("sqlite:///x.db", "sqlite"),
    ],
)
def test_normalize_url_uses_psycopg_3_for_postgresql(url: str, driver: str) -> None:
    assert make_url(normalize_url(url)).drivername == driver


def test_normalize_url_keeps_the_password() -> None:
    url = normalize_url("postgresql://user:s%40cret@host:5433/db")
    assert make_url(url).password == "s@cret"


def test_alembic_config_keeps_a_percent_in_the_password() -> None:
    config = alembic_config("postgresql://user:50%25off@host/db")
    assert make_url(config.get_main_option("sqlalchemy.url") or "").password == "50%off"


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def test_sqlite_runs_in_wal_mode(sqlite_engine: Engine) -> None:
    with sqlite_engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def _database_file_bytes(engine: Engine) -> int:
    return Path(str(engine.url.database)).stat().st_size


def test_large_commits_leave_the_checkpoint_to_the_background_checkpointer(
    sqlite_engine: Engine,
) -> None:
    blob = os.urandom(8 * 1024 * 1024)  # 2,048 pages: past SQLite's default auto-checkpoint
    with sqlite_engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE blobs (data BLOB)")
        conn.exec_driver_sql("INSERT INTO blobs VALUES (?)", (blob,))
    # Committed into the WAL; the commit did not copy it into the database file.
    assert _database_file_bytes(sqlite_engine) < len(blob)

    checkpointer = WalCheckpointer(sqlite_engine, interval_s=0.05)
    checkpointer.start()
    try:
        deadline = time.monotonic() + 10
        while _database_file_bytes(sqlite_engine) < len(blob) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        checkpointer.stop()
    assert _database_file_bytes(sqlite_engine) >= len(blob)


def test_sqlite_reads_run_beside_an_open_write(sqlite_engine: Engine) -> None:
    with sqlite_engine.begin() as writer:
        writer.execute(text("DELETE FROM jobs"))
        with readonly(sqlite_engine).connect() as reader:
            assert reader.execute(text("SELECT count(*) FROM jobs")).scalar() == 0


def test_sqlite_writers_queue_instead_of_failing(sqlite_engine: Engine) -> None:
    holding = threading.Event()
    errors: list[BaseException] = []

    def hold_the_write_lock() -> None:
        try:
            with sqlite_engine.begin() as conn:
                conn.execute(text("SELECT count(*) FROM jobs"))  # a read that later writes
                holding.set()
                time.sleep(0.3)
                conn.execute(text("DELETE FROM jobs"))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=hold_the_write_lock)
    thread.start()
    assert holding.wait(5)
    started = time.monotonic()
    with sqlite_engine.begin() as conn:  # waits on busy_timeout for the first to commit
        conn.execute(text("SELECT count(*) FROM jobs"))
        conn.execute(text("DELETE FROM model_versions"))
    thread.join(5)
    assert not errors
    assert time.monotonic() - started > 0.1


def test_a_sqlite_writer_waits_for_a_short_lock_in_short_pauses(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's own wait sleeps 1 ms and more between tries, longer than most transactions
    hold the write lock: the begin tries again after pauses of a fraction of a millisecond,
    and leaves SQLite's busy timeout as it found it."""
    holding, release = threading.Event(), threading.Event()
    pauses: list[float] = []
    real_sleep = time.sleep

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:
            release.set()  # the holder commits after the waiter's third try
        real_sleep(seconds)

    monkeypatch.setattr(engine_module.time, "sleep", pause)

    def hold_the_write_lock() -> None:
        with sqlite_engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs"))
            holding.set()
            release.wait(5)

    thread = threading.Thread(target=hold_the_write_lock)
    thread.start()
    assert holding.wait(5)
    with sqlite_engine.begin() as conn:
        conn.execute(text("DELETE FROM model_versions"))
        timeout_ms = conn.execute(text("PRAGMA busy_timeout")).scalar()
    thread.join(5)
    assert len(pauses) >= 3 and max(pauses) <= 0.001
    assert timeout_ms == engine_module.BUSY_TIMEOUT_MS


def test_a_sqlite_error_at_begin_is_raised_as_sqlalchemy_raises_it(sqlite_engine: Engine) -> None:
    """Not a lock: the begin gives up its own tries, and SQLAlchemy's BEGIN raises the error
    wrapped as every other database error is (what the API and the workers catch)."""
    with sqlite_engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        raw.execute("BEGIN")  # a transaction SQLAlchemy knows nothing of
        try:
            with pytest.raises(OperationalError, match="within a transaction"):
                conn.begin()
        finally:
            if raw.in_transaction:  # (SQLAlchemy rolls back after an error)
                raw.execute("ROLLBACK")
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == engine_module.BUSY_TIMEOUT_MS


def test_times_are_stored_as_utc_and_read_back_aware(engine: Engine) -> None:
    plus_two = timezone(timedelta(hours=2))
    created = datetime(2030, 5, 1, 14, 0, tzinfo=plus_two)
    with Session(engine) as session, session.begin():
        session.add(Job(id="t", model="m", version=1, samples=1, created_at=created))
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT created_at FROM jobs WHERE id = 't'")).scalar()
    assert str(stored).startswith("2030-05-01 12:00:00")
    with Session(engine) as session:
        job = session.get(Job, "t")
        assert job is not None
        assert job.created_at == created
        assert job.created_at.tzinfo == UTC


def test_a_failed_statement_never_shows_its_bound_values(engine: Engine) -> None:
    from sqlalchemy.exc import DBAPIError

    with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
        conn.execute(
            text("SELECT * FROM no_such_table WHERE x = :secret"), {"secret": "tff_s3cr3t"}
        )

    assert "tff_s3cr3t" not in str(caught.value)
    assert "hidden" in str(caught.value)
