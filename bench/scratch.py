"""A scratch database for a benchmark: created on the server `url` names (PostgreSQL), or a
SQLite file, migrated; dropped (or deleted) afterwards, whatever happens."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from db.engine import make_engine
from db.migrate import upgrade


@contextmanager
def scratch_database(url: str) -> Iterator[str]:
    """The URL of a new, migrated database beside `url`'s (a temporary file for SQLite)."""
    if url.startswith("sqlite"):
        with tempfile.TemporaryDirectory(prefix="tffleet-bench-") as tmp:
            scratch = f"sqlite:///{Path(tmp) / 'bench.db'}"
            upgrade(scratch)
            yield scratch
        return
    admin = make_engine(url, isolation_level="AUTOCOMMIT")
    name = f"tffleet_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        scratch = make_url(url).set(database=name).render_as_string(hide_password=False)
        upgrade(scratch)
        yield scratch
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
