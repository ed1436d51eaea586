"""presence: when a child last took work of a version it holds (a fleet that stopped consuming)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_presence", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_presence", schema=None) as batch_op:
        batch_op.drop_column("claimed_at")
