"""transforms: an Idempotency-Key per tenant and its request's hash (a retried POST finds it)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("transforms", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint(
            "uq_transforms_tenant_idempotency_key", ["tenant", "idempotency_key"]
        )


def downgrade() -> None:
    with op.batch_alter_table("transforms", schema=None) as batch_op:
        batch_op.drop_constraint("uq_transforms_tenant_idempotency_key", type_="unique")
        batch_op.drop_column("request_hash")
        batch_op.drop_column("idempotency_key")
