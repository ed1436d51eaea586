"""webhooks: a job's webhook and events, a tenant's signing secret, the deliveries outbox

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("webhook_events", sa.Integer(), nullable=True))
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook_secret", sa.String(length=64), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("job_status", sa.String(length=16), nullable=False),
        sa.Column("job_attempts", sa.Integer(), nullable=False),
        sa.Column("job_started_at", sa.DateTime(), nullable=True),
        sa.Column("job_finished_at", sa.DateTime(), nullable=True),
        sa.Column("job_error_code", sa.String(length=64), nullable=True),
        sa.Column("job_error_message", sa.Text(), nullable=True),
        sa.Column("job_deadline_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "event", "at", name="uq_webhook_deliveries_event"),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["status", "tenant", "next_attempt_at"],
        unique=False,
    )
    op.create_index(
        "ix_webhook_deliveries_created_at", "webhook_deliveries", ["created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_created_at", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("webhook_secret")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("webhook_events")
        batch_op.drop_column("webhook")
