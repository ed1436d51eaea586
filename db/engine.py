"""Engines and sessions for SQLite (the embedded default) and PostgreSQL (production)."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

# SQLite checkpoints (copies the WAL back into the database file, then syncs it) in whichever
# connection commits past this many WAL pages. Job inputs can be megabytes, so at SQLite's default
# of 1000 pages (4 MB) nearly every large submission paid for a checkpoint inside its commit. The
# API checkpoints from a thread of its own instead (`WalCheckpointer`); this is the backstop for a
# fleet that runs without one.
_WAL_AUTOCHECKPOINT_PAGES = 25_000  # ~100 MB

# PostgreSQL: a server that does not answer fails a connect in this time, and no statement runs
# longer than this (a lock held by a stuck session, a runaway query) instead of holding a request
# or a worker forever. Every statement tffleet runs is bounded (chunks of at most 1,000 jobs).
CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_S = 30

# SQLite: how long a statement waits for a lock before "database is locked".
BUSY_TIMEOUT_MS = 30_000
# SQLite's own wait for a lock sleeps 1, 2, 5, 10, 15... ms between tries, where the writer it
# waits for (a submit's insert, a claim, a batch's results) holds the write lock for a fraction
# of a millisecond: under load, a transaction slept several times longer than the one it waited
# for. A write transaction's lock is tried again after these pauses first (about 5 ms in all,
# each try a microsecond), then with SQLite's own wait for the rest of BUSY_TIMEOUT_MS.
_LOCK_PAUSES_S = (0.00005,) * 20 + (0.0002,) * 20


def normalize_url(url: str) -> str:
    """Use psycopg 3 for a bare `postgresql://` URL (the driver tffleet installs)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    if make_url(url).get_backend_name() == "sqlite":
        return _sqlite_engine(url, **kwargs)
    # No pre-ping: it costs a round trip per transaction. After a server restart the first use of
    # a dead connection fails (a 503, or a task retry) and SQLAlchemy then replaces the whole pool.
    connect_args = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "options": f"-c statement_timeout={STATEMENT_TIMEOUT_S * 1000}",
    }
    # hide_parameters: an error's log line names the statement, never the values bound to it
    # (inputs, keys, idempotency keys).
    return create_engine(
        url, pool_recycle=1800, hide_parameters=True, connect_args=connect_args, **kwargs
    )


def _sqlite_engine(url: str, **kwargs: Any) -> Engine:
    # The API and every worker child write to one file: WAL lets readers run beside the writer,
    # and BEGIN IMMEDIATE takes the write lock up front, so two writers queue on busy_timeout
    # instead of failing with "database is locked" when a read upgrades to a write.
    engine = create_engine(
        url,
        connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
        hide_parameters=True,
        **kwargs,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let the "begin" hook below emit BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA wal_autocheckpoint={_WAL_AUTOCHECKPOINT_PAGES}")
        cursor.execute("PRAGMA journal_size_limit=67108864")  # shrink the WAL file back to 64 MB
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A read-only session needs no explicit transaction: in WAL mode each SELECT reads a
        # consistent snapshot on its own, and skipping BEGIN saves a round trip per read.
        if not conn.get_execution_options().get("tffleet_readonly", False):
            _begin_immediate(conn)

    return engine


def _begin_immediate(conn: Connection) -> None:
    """BEGIN IMMEDIATE: the write lock, waited for in short pauses, then in SQLite's own wait."""
    if not _take_write_lock(conn.connection.dbapi_connection):
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # its errors raised as SQLAlchemy raises them


def _take_write_lock(dbapi_connection: Any) -> bool:
    """Whether BEGIN IMMEDIATE took the lock within `_LOCK_PAUSES_S`; False too on any other
    error, for the caller's BEGIN to meet again."""
    try:
        dbapi_connection.execute("PRAGMA busy_timeout=0")
        try:
            for pause in _LOCK_PAUSES_S:
                try:
                    dbapi_connection.execute("BEGIN IMMEDIATE")
                    return True
                except sqlite3.OperationalError as exc:
                    if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                        return False
                time.sleep(pause)
            return False
        finally:
            dbapi_connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    except sqlite3.Error:
        return False


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def readonly(engine: Engine) -> Engine:
    """The same pool, marked so SQLite starts a plain (shared) read transaction."""
    return engine.execution_options(tffleet_readonly=True)


class WalCheckpointer:
    """Checkpoints a SQLite database's WAL every `interval_s` from a thread of its own, so that
    no request's commit waits for a checkpoint. Does nothing on other databases.

    PASSIVE: it never blocks readers or writers; what it cannot copy yet, it copies next time.
    """

    def __init__(self, engine: Engine, *, interval_s: float = 0.5) -> None:
        self._engine = engine
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._engine.dialect.name != "sqlite" or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="wal-checkpointer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                connection = self._engine.raw_connection()
                try:
                    cursor = connection.cursor()
                    cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    cursor.close()
                finally:
                    connection.close()
            except Exception as exc:  # the database file went away, say: try again later
                log.warning("WAL checkpoint failed: %s", exc)
