"""Deadlines order the claim (SQLite and PostgreSQL): among a tenant's queued jobs of one
priority, those with a `Cancel-After` deadline go first, earliest deadline first; those without
one follow by age. Priority still comes first, and tenants still take turns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from alembic import command
from sqlalchemy import Engine, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, parts, tenants
from db.engine import make_engine
from db.jobs import claims
from db.migrate import alembic_config
from db.models import DEFAULT_TENANT
from db.models.jobs import NO_DEADLINE
from tffleet import tensors

Sessions = sessionmaker[Session]


def create(
    sessions: Sessions,
    count: int = 1,
    *,
    cancel_after_s: float | None = None,
    priority: int = 0,
    tenant: str = DEFAULT_TENANT,
) -> list[str]:
    new = jobs.NewJob(
        model="m",
        version=1,
        samples=1,
        inputs=b"in",
        priority=priority,
        tenant=tenant,
        cancel_after_s=cancel_after_s,
    )
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=tenant)
        return [row.id for row in jobs.create(session=session, jobs=[new] * count)]


def claim_order(sessions: Sessions, *, batch: int) -> list[str]:
    """Every queued job of m:1, in the order the claim takes them, `batch` samples a claim."""
    order: list[str] = []
    while True:
        with sessions.begin() as session:
            leases = jobs.claim_next(
                session=session, model="m", version=1, owner="w", lease_s=60, max_samples=batch
            )
        if not leases:
            return order
        order += [lease.job_id for lease in leases]


def test_a_job_with_a_near_deadline_is_claimed_before_a_backlog_of_its_priority(
    sessions: Sessions,
) -> None:
    backlog = create(sessions, 40)
    (far,) = create(sessions, cancel_after_s=3600)
    (near,) = create(sessions, cancel_after_s=60)

    with sessions.begin() as session:
        first = jobs.claim_next(
            session=session, model="m", version=1, owner="w", lease_s=60, max_samples=1
        )

    assert [lease.job_id for lease in first] == [near]
    assert claim_order(sessions, batch=8) == [far, *backlog]


def test_priority_goes_before_deadlines_and_age_after_them(sessions: Sessions) -> None:
    (low_with_deadline,) = create(sessions, cancel_after_s=10, priority=-1)
    backlog = create(sessions, 3)
    (high,) = create(sessions, priority=5)
    same = create(sessions, 2, cancel_after_s=600)  # one deadline: by age
    (sooner,) = create(sessions, cancel_after_s=300)

    assert claim_order(sessions, batch=1) == [high, sooner, *same, *backlog, low_with_deadline]


def test_tenants_still_take_turns_and_a_deadline_orders_its_own_tenants_jobs(
    sessions: Sessions,
) -> None:
    a_backlog = create(sessions, 3, tenant="a")
    b_backlog = create(sessions, 3, tenant="b")
    (a_urgent,) = create(sessions, cancel_after_s=30, tenant="a")

    with sessions.begin() as session:
        leases = jobs.claim_next(
            session=session, model="m", version=1, owner="w", lease_s=60, max_samples=4
        )

    # Equal weights: two jobs each; a's deadline job leads a's share, b keeps its own.
    assert sorted(lease.job_id for lease in leases) == sorted(
        [a_urgent, a_backlog[0], *b_backlog[:2]]
    )


def test_a_retry_gives_the_job_its_new_deadlines_place(sessions: Sessions) -> None:
    backlog = create(sessions, 3)
    (job_id,) = create(sessions)
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=job_id)
        jobs.retry(session=session, job_id=job_id, cancel_after_s=60)

    assert claim_order(sessions, batch=1) == [job_id, *backlog]


def test_the_parts_of_a_split_job_keep_its_deadlines_place(sessions: Sessions) -> None:
    backlog = create(sessions, 3)  # older than the job and its parts
    packed = tensors.pack({"x": np.arange(8, dtype=np.float32).reshape(4, 2)})
    new = jobs.NewJob(model="m", version=1, samples=4, inputs=packed, cancel_after_s=60)
    with sessions.begin() as session:
        job_id = jobs.create(session=session, jobs=[new])[0].id
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
    with sessions.begin() as session:
        ids = parts.split(session=session, lease=lease, model="m", version=1, part_samples=2)

    assert claim_order(sessions, batch=1) == [*ids, *backlog]


def test_sqlite_claims_by_priority_and_deadline_from_the_index_without_sorting(
    engine: Engine, sessions: Sessions
) -> None:
    if engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's plan: tests/db/test_claim_plan.py")
    for i in range(10):
        create(sessions, 50, priority=i % 3, cancel_after_s=60.0 * (i + 1) if i % 2 else None)
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE")
        named = sqlite.dialect(paramstyle="named")  # bound by name, as the parameters below
        statement = claims._candidates_statement(fresh_only=True).compile(dialect=named)
        params = {"n_model": "m", "n_version": 1, "n_tenant": DEFAULT_TENANT, "n_limit": 128}
        rows = conn.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {statement}", {**statement.params, **params}
        )
        plan = "\n".join(str(row[-1]) for row in rows)

    assert "ix_jobs_pick" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_migration_0019_gives_queued_jobs_their_deadlines_place(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    config = alembic_config(url)
    command.upgrade(config, "0018")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for job_id, deadline in (("j1", "2030-01-01 00:00:00.000000"), ("j2", None)):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, model, version, status, priority, samples, "
                        "attempts, created_at, deadline_at) VALUES (:id, 'm', 1, 'queued', 0, 1, "
                        "0, '2029-01-01 00:00:00.000000', :deadline)"
                    ),
                    {"id": job_id, "deadline": deadline},
                )
        command.upgrade(config, "head")
        with engine.connect() as conn:
            picks = dict(conn.execute(text("SELECT id, pick_deadline FROM jobs")).all())
    finally:
        engine.dispose()

    assert picks == {
        "j1": "2030-01-01 00:00:00.000000",
        "j2": NO_DEADLINE.strftime("%Y-%m-%d %H:%M:%S.%f"),
    }
