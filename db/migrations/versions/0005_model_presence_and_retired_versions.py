"""model presence and retired versions

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retired_at", sa.DateTime(), nullable=True))

    op.create_table(
        "model_presence",
        sa.Column("child", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("since", sa.DateTime(), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("child", "name", "version"),
    )
    with op.batch_alter_table("model_presence", schema=None) as batch_op:
        batch_op.create_index(
            "ix_model_presence_model", ["name", "version", "seen_at"], unique=False
        )
        batch_op.create_index("ix_model_presence_seen_at", ["seen_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("model_presence", schema=None) as batch_op:
        batch_op.drop_index("ix_model_presence_seen_at")
        batch_op.drop_index("ix_model_presence_model")
    op.drop_table("model_presence")

    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_column("retired_at")
