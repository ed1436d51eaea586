"""the claim's order by deadline: a job's pick_deadline (its deadline_at, or 9999-12-31 without
one) and ix_jobs_pick by priority, then pick_deadline, then age

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# As SQLAlchemy writes this time to SQLite: the default must sort and compare as bound values do.
NO_DEADLINE = "'9999-12-31 00:00:00.000000'"


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "pick_deadline", sa.DateTime(), server_default=sa.text(NO_DEADLINE), nullable=False
            )
        )
    op.execute("UPDATE jobs SET pick_deadline = deadline_at WHERE deadline_at IS NOT NULL")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_pick")
        batch_op.create_index(
            "ix_jobs_pick",
            [
                "model",
                "version",
                "status",
                "tenant",
                sa.text("priority DESC"),
                "pick_deadline",
                "id",
            ],
            unique=False,
        )


def downgrade() -> None:
    # The column goes in a batch of its own (SQLite copies the table), the index after it: a
    # copy cannot carry an index on `priority DESC` given as text.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_pick")
        batch_op.drop_column("pick_deadline")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_pick",
            ["model", "version", "status", "tenant", sa.text("priority DESC"), "id"],
            unique=False,
        )
