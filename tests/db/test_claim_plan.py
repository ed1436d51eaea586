"""The claim reads a tenant's queued jobs in index order: no sort of the queue per claim.

`ix_jobs_pick` holds priority descending, as the claim orders it (`db.jobs.claims` candidates:
priority highest first, then deadline, then age), so PostgreSQL walks the index and stops at the
batch's limit. With the ascending index it had, it sorted the tenant's whole queue on every
claim: 40 to 66 ms per claim at 64,000 queued jobs, against 0.1 ms.

"Never claimed in this run" is `attempts <= budget_from` (equal, as attempts never falls below
it), not `attempts = budget_from`: PostgreSQL estimates a column equal to another column at 0.5%
of the rows, too few to walk the index for, and planned a Seq Scan and a Sort of the whole queue.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from db import jobs
from db.engine import make_sessionmaker
from db.jobs import claims
from db.models import DEFAULT_TENANT


def test_postgres_claims_by_priority_from_the_index_without_sorting_the_queue(
    engine: Engine,
) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite's planner is not the one that sorted")
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        jobs.create(
            session=session,
            jobs=[
                jobs.NewJob(model="m", version=1, samples=1, inputs=b"x", priority=i % 7)
                for i in range(5000)
            ],
        )
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        statement = claims._candidates_statement(fresh_only=True).compile(dialect=engine.dialect)
        params = {"n_model": "m", "n_version": 1, "n_tenant": DEFAULT_TENANT, "n_limit": 128}
        rows = conn.exec_driver_sql(f"EXPLAIN {statement}", {**statement.params, **params})
        plan = "\n".join(row[0] for row in rows)

    assert "ix_jobs_pick" in plan, plan
    assert "Sort" not in plan, plan
    assert "Seq Scan" not in plan, plan


def test_postgres_claims_by_deadline_within_a_priority_from_the_index_without_sorting(
    engine: Engine,
) -> None:
    """Deadlines order a priority's jobs (`pick_deadline`, in `ix_jobs_pick` after the priority):
    the walk still stops at the batch's limit."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite's plan: tests/db/test_deadline_order.py")
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        jobs.create(
            session=session,
            jobs=[
                jobs.NewJob(
                    model="m",
                    version=1,
                    samples=1,
                    inputs=b"x",
                    priority=i % 7,
                    cancel_after_s=float(60 + i % 500) if i % 3 == 0 else None,
                )
                for i in range(5000)
            ],
        )
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        statement = claims._candidates_statement(fresh_only=True).compile(dialect=engine.dialect)
        params = {"n_model": "m", "n_version": 1, "n_tenant": DEFAULT_TENANT, "n_limit": 128}
        rows = conn.exec_driver_sql(f"EXPLAIN {statement}", {**statement.params, **params})
        plan = "\n".join(row[0] for row in rows)

    assert "ix_jobs_pick" in plan, plan
    assert "Sort" not in plan, plan
    assert "Seq Scan" not in plan, plan
