"""a job's deadline (Cancel-After) and where its attempt budget starts after a retry

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deadline_at", sa.DateTime(), nullable=True))
        batch_op.add_column(
            sa.Column("budget_from", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.create_index("ix_jobs_deadline", ["status", "deadline_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_deadline")
        batch_op.drop_column("budget_from")
        batch_op.drop_column("deadline_at")
