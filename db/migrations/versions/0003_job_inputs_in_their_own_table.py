"""job inputs in their own table

SQLite rewrites a whole row on every update, so a claim or a result rewrote the inputs blob too.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_inputs",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.execute(
        "INSERT INTO job_inputs (job_id, data) SELECT id, inputs FROM jobs WHERE inputs IS NOT NULL"
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("inputs")


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("inputs", sa.LargeBinary(), nullable=True))
    op.execute(
        "UPDATE jobs SET inputs = (SELECT data FROM job_inputs WHERE job_inputs.job_id = jobs.id)"
    )
    op.drop_table("job_inputs")
