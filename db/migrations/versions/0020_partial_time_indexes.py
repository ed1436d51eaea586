"""ix_jobs_deadline and ix_jobs_queue_timeout hold only the jobs that have a deadline or a queue
time-out: most jobs have neither, and each of their status changes no longer writes to them;
ix_jobs_ttl_unstamped holds the jobs whose own ttl_s the sweeper has yet to turn into expires_at,
which it read through every job without an expires_at, under SQLite's write lock, each sweep

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

INDEXES = {"ix_jobs_deadline": "deadline_at", "ix_jobs_queue_timeout": "queue_timeout_at"}


UNSTAMPED = sa.text("ttl_s IS NOT NULL AND expires_at IS NULL")


def upgrade() -> None:
    for name, column in INDEXES.items():
        op.drop_index(name, table_name="jobs")
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            name, "jobs", ["status", column], sqlite_where=where, postgresql_where=where
        )
    op.create_index(
        "ix_jobs_ttl_unstamped",
        "jobs",
        ["expires_at", "status"],
        sqlite_where=UNSTAMPED,
        postgresql_where=UNSTAMPED,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_ttl_unstamped", table_name="jobs")
    for name, column in INDEXES.items():
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", ["status", column])
