"""object store: garbage written ahead of an object's write, due at not_before

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null (every row there is now): due at once, as before.
    with op.batch_alter_table("object_garbage", schema=None) as batch_op:
        batch_op.add_column(sa.Column("not_before", sa.DateTime(), nullable=True))
        batch_op.create_index("ix_object_garbage_key", ["key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("object_garbage", schema=None) as batch_op:
        batch_op.drop_index("ix_object_garbage_key")
        batch_op.drop_column("not_before")
