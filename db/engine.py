"""Engines and sessions for SQLite (the embedded default) and PostgreSQL (production)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


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
    return create_engine(url, pool_recycle=1800, **kwargs)


def _sqlite_engine(url: str, **kwargs: Any) -> Engine:
    # The API and every worker child write to one file: WAL lets readers run beside the writer,
    # and BEGIN IMMEDIATE takes the write lock up front, so two writers queue on busy_timeout
    # instead of failing with "database is locked" when a read upgrades to a write.
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let the "begin" hook below emit BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A read-only session needs no explicit transaction: in WAL mode each SELECT reads a
        # consistent snapshot on its own, and skipping BEGIN saves a round trip per read.
        if not conn.get_execution_options().get("tffleet_readonly", False):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def readonly(engine: Engine) -> Engine:
    """The same pool, marked so SQLite starts a plain (shared) read transaction."""
    return engine.execution_options(tffleet_readonly=True)
