"""ix_jobs_deadline and ix_jobs_queue_timeout hold only the jobs that have a deadline or a queue
time-out: most jobs have neither, and each of their status changes no longer writes to them

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


def upgrade() -> None:
    for name, column in INDEXES.items():
        op.drop_index(name, table_name="jobs")
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            name, "jobs", ["status", column], sqlite_where=where, postgresql_where=where
        )


def downgrade() -> None:
    for name, column in INDEXES.items():
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", ["status", column])
