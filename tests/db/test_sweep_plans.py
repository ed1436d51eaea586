"""The sweeper's statements that run under SQLite's write lock every sweep read an index of the
few rows they want, never every job: a statement that read the table grew with it, and held
every submit and claim of the fleet behind it (a 30-minute soak's p99 rose with the file).

Each sweeper call runs against a SQLite file; every SELECT it sends is explained as sent."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session

from db import jobs, parts
from db.clock import utcnow
from db.engine import make_engine, make_sessionmaker


def plans(engine: Engine, call: Callable[[Session], Any]) -> list[str]:
    """What SQLite's planner does with each SELECT `call` sends (and the SELECT of each
    UPDATE or DELETE whose WHERE it must search), one line per table read."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with make_sessionmaker(engine).begin() as session:
            call(session)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    lines = []
    with engine.connect() as conn:
        for statement, parameters in sent:
            for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters):
                lines.append(str(row[-1]))
    return lines


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: jobs.stamp_expiry(session=s, limit=100), id="stamp_expiry"),
        pytest.param(lambda s: jobs.cancel_overdue(session=s, now=utcnow()), id="cancel_overdue"),
        pytest.param(
            lambda s: jobs.cancel_unstarted(session=s, now=utcnow()), id="cancel_unstarted"
        ),
        pytest.param(
            lambda s: jobs.purge_finished(
                session=s, older_than=utcnow() - timedelta(days=7), limit=100
            ),
            id="purge_finished",
        ),
        pytest.param(
            lambda s: jobs.purge_inputs(
                session=s,
                since=utcnow() - timedelta(hours=2),
                older_than=utcnow() - timedelta(hours=1),
                limit=100,
            ),
            id="purge_inputs",
        ),
        pytest.param(
            lambda s: jobs.expire_leases(session=s, now=utcnow(), max_attempts=3, limit=100),
            id="expire_leases",
        ),
        pytest.param(
            lambda s: jobs.stale_queued(session=s, older_than=utcnow(), limit=100),
            id="stale_queued",
        ),
        pytest.param(lambda s: parts.stranded(session=s), id="parts_stranded"),
    ],
)
def test_a_sweep_statement_reads_an_index_of_the_rows_it_wants(
    sqlite_url: str, call: Callable[[Session], Any], request: pytest.FixtureRequest
) -> None:
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))  # as an operator's PRAGMA optimize would, or not
        found = plans(engine, call)
    finally:
        engine.dispose()
    reads = [line for line in found if " jobs " in f"{line} "]
    assert reads, found
    for line in reads:
        assert not line.startswith(("SCAN jobs", "SCAN parent")), found
        # Every job without an expires_at (nearly all) is no search for a few.
        assert "ix_jobs_expires_at (expires_at=?)" not in line, found
        # ... nor is every ended job, read by their status (the queued ones may be).
        if "stale_queued" not in request.node.name:
            assert not line.endswith("(status=?)"), found
