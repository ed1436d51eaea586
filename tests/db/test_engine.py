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
from sqlalchemy.orm import Session

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
