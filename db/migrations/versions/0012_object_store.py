"""object store: uploads, the jobs pinning them, a job's stored bytes, and the store's garbage

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "uploads",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("dtype", sa.String(length=16), nullable=True),
        sa.Column("shape", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_uploads_expires_at", "uploads", ["expires_at"], unique=False)
    op.create_table(
        "job_uploads",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("upload_id", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "upload_id"),
    )
    op.create_index("ix_job_uploads_upload_id", "job_uploads", ["upload_id"], unique=False)
    op.create_table(
        "object_garbage",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("prefix", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("stored_bytes")
    op.drop_table("object_garbage")
    op.drop_index("ix_job_uploads_upload_id", table_name="job_uploads")
    op.drop_table("job_uploads")
    op.drop_index("ix_uploads_expires_at", table_name="uploads")
    op.drop_table("uploads")
