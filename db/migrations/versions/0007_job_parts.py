"""a job split into parts that every child may run (db/parts.py)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("part_offset", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("parts", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("samples_done", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            "fk_jobs_parent_id", "jobs", ["parent_id"], ["id"], ondelete="CASCADE"
        )
        batch_op.create_index("ix_jobs_parent_id", ["parent_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_parent_id")
        batch_op.drop_constraint("fk_jobs_parent_id", type_="foreignkey")
        batch_op.drop_column("samples_done")
        batch_op.drop_column("parts")
        batch_op.drop_column("part_offset")
        batch_op.drop_column("parent_id")
