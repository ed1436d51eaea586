"""What the fleet's database holds on disk, for /metrics (api/storage.py) and the console.

Cheap reads only, as they run at scrape time: the database's size from the catalog (PostgreSQL's
`pg_database_size`, SQLite's page count, and its WAL file beside it), and how many ended and
unfinished jobs still keep their inputs, the bulk of those bytes (TFFLEET_INPUT_TTL_S bounds
them). Nothing here scans the blobs themselves: a SUM over their lengths reads every one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from db.models import JobInput


def database_bytes(*, session: Session) -> int:
    """The database's size on disk, in bytes."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        return int(session.scalar(text("SELECT pg_database_size(current_database())")) or 0)
    pages = int(session.scalar(text("PRAGMA page_count")) or 0)
    size = pages * int(session.scalar(text("PRAGMA page_size")) or 0)
    path = bind.engine.url.database
    if path and path != ":memory:":
        # Committed pages not yet copied back into the file (db.engine.WalCheckpointer).
        wal = f"{path}-wal"
        size += os.path.getsize(wal) if os.path.exists(wal) else 0
    return size


@dataclass(frozen=True)
class Inputs:
    """The jobs whose inputs are stored (queued, running, ended within TFFLEET_INPUT_TTL_S), and
    their bytes where the database knows them without reading them (PostgreSQL), else None."""

    kept: int
    bytes: int | None


def inputs(*, session: Session) -> Inputs:
    """How many jobs keep their inputs: a count over the primary key of `job_inputs`, which the
    input retention keeps to the backlog and the last TFFLEET_INPUT_TTL_S of ended jobs."""
    kept = int(session.scalar(select(func.count()).select_from(JobInput)) or 0)
    if session.get_bind().dialect.name != "postgresql":
        return Inputs(kept, None)
    # The table, its index and its TOAST (where the blobs are), from the catalog.
    size = session.scalar(text("SELECT pg_total_relation_size('job_inputs')"))
    return Inputs(kept, int(size or 0))
