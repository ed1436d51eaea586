"""console: a job's history (each attempt and each return to the queue), a child's busy share

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("history", sa.Text(), nullable=True))
    with op.batch_alter_table("model_presence", schema=None) as batch_op:
        batch_op.add_column(sa.Column("busy", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_presence", schema=None) as batch_op:
        batch_op.drop_column("busy")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("history")
