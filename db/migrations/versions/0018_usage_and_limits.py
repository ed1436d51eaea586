"""usage and limits: a job's device time and queue time-out, usage by hour, a key's limits

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("device_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("queue_timeout_at", sa.DateTime(), nullable=True))
        batch_op.create_index("ix_jobs_queue_timeout", ["status", "queue_timeout_at"])
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rate_per_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("rate_burst", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_active_jobs", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("allowed_models", sa.Text(), nullable=True))
    op.create_table(
        "usage_records",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("bucket", sa.DateTime(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("device_s", sa.Float(), nullable=False),
        sa.Column("queue_s", sa.Float(), nullable=False),
        sa.Column("run_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_usage_records_bucket", "usage_records", ["bucket"])
    op.create_index("ix_usage_records_tenant_bucket", "usage_records", ["tenant", "bucket"])


def downgrade() -> None:
    op.drop_index("ix_usage_records_tenant_bucket", table_name="usage_records")
    op.drop_index("ix_usage_records_bucket", table_name="usage_records")
    op.drop_table("usage_records")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("allowed_models")
        batch_op.drop_column("max_active_jobs")
        batch_op.drop_column("rate_burst")
        batch_op.drop_column("rate_per_s")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_queue_timeout")
        batch_op.drop_column("queue_timeout_at")
        batch_op.drop_column("device_s")
