"""transforms: a model run over files, and the shard jobs that name theirs (jobs.transform_id)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "transforms",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("output_uri", sa.Text(), nullable=False),
        sa.Column("errors_uri", sa.Text(), nullable=True),
        sa.Column("records", sa.BigInteger(), nullable=False),
        sa.Column("records_succeeded", sa.BigInteger(), nullable=False),
        sa.Column("records_failed", sa.BigInteger(), nullable=False),
        sa.Column("shards_total", sa.Integer(), nullable=False),
        sa.Column("shards_done", sa.Integer(), nullable=False),
        sa.Column("shards_failed", sa.Integer(), nullable=False),
        sa.Column("webhook", sa.Text(), nullable=True),
        sa.Column("webhook_events", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"], name="fk_transforms_tenant"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_transforms_tenant_id", "transforms", ["tenant", "id"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("transform_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("shard", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            "fk_jobs_transform_id", "transforms", ["transform_id"], ["id"], ondelete="CASCADE"
        )
        batch_op.create_index("ix_jobs_transform_id", ["transform_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_transform_id")
        batch_op.drop_constraint("fk_jobs_transform_id", type_="foreignkey")
        batch_op.drop_column("shard")
        batch_op.drop_column("transform_id")
    op.drop_index("ix_transforms_tenant_id", table_name="transforms")
    op.drop_table("transforms")
