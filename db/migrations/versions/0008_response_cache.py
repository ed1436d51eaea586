"""the response cache: job_cache, and a job's cache_key and cached (db/cache.py); the claim's
index by priority, highest first

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("outputs", sa.LargeBinary(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ix_job_cache_created_at", "job_cache", ["created_at", "size"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cache_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("cached", sa.Boolean(), server_default="0", nullable=False))
        # The claim reads a tenant's queued jobs by priority, highest first, then age.
        batch_op.drop_index("ix_jobs_pick")
        batch_op.create_index(
            "ix_jobs_pick",
            ["model", "version", "status", "tenant", sa.text("priority DESC"), "id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_pick")
        batch_op.create_index(
            "ix_jobs_pick", ["model", "version", "status", "tenant", "priority", "id"], unique=False
        )
        batch_op.drop_column("cached")
        batch_op.drop_column("cache_key")
    op.drop_index("ix_job_cache_created_at", table_name="job_cache")
    op.drop_table("job_cache")
