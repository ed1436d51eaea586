"""tenants and api keys; jobs belong to a tenant, idempotency keys are per tenant; fleet secrets

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

DEFAULT_TENANT = "default"
# 0001 left the unique constraint on jobs.idempotency_key unnamed: PostgreSQL named it itself,
# and SQLite's batch mode finds it by this convention.
_UNNAMED = {"uq": "uq_%(table_name)s_%(column_0_name)s"}
_OLD_UNIQUE = {"postgresql": "jobs_idempotency_key_key"}


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.Column("max_samples_per_job", sa.Integer(), nullable=True),
        sa.Column("max_priority", sa.Integer(), nullable=True),
        sa.Column("max_ttl_s", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("note", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
        sa.PrimaryKeyConstraint("prefix"),
    )
    op.execute(
        sa.text(
            "INSERT INTO tenants (name, created_at, weight) VALUES (:name, CURRENT_TIMESTAMP, 1)"
        ).bindparams(name=DEFAULT_TENANT)
    )
    op.create_table(
        "fleet_secrets",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )

    dialect = op.get_bind().dialect.name
    with op.batch_alter_table("jobs", naming_convention=_UNNAMED) as batch_op:
        batch_op.add_column(
            sa.Column("tenant", sa.String(length=64), nullable=False, server_default=DEFAULT_TENANT)
        )
        batch_op.drop_constraint(
            _OLD_UNIQUE.get(dialect, "uq_jobs_idempotency_key"), type_="unique"
        )
        batch_op.create_unique_constraint(
            "uq_jobs_tenant_idempotency_key", ["tenant", "idempotency_key"]
        )
        batch_op.create_index("ix_jobs_tenant_id", ["tenant", "id"], unique=False)
        batch_op.create_index("ix_jobs_tenant_status", ["tenant", "status"], unique=False)
        batch_op.create_foreign_key("fk_jobs_tenant", "tenants", ["tenant"], ["name"])
        # The claim goes tenant by tenant (fair share): the tenant comes before the priority.
        batch_op.drop_index("ix_jobs_pick")
        batch_op.create_index(
            "ix_jobs_pick", ["model", "version", "status", "tenant", "priority", "id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index("ix_jobs_pick")
        batch_op.create_index(
            "ix_jobs_pick", ["model", "version", "status", "priority", "id"], unique=False
        )
        batch_op.drop_constraint("fk_jobs_tenant", type_="foreignkey")
        batch_op.drop_index("ix_jobs_tenant_status")
        batch_op.drop_index("ix_jobs_tenant_id")
        batch_op.drop_constraint("uq_jobs_tenant_idempotency_key", type_="unique")
        batch_op.create_unique_constraint("jobs_idempotency_key_key", ["idempotency_key"])
        batch_op.drop_column("tenant")
    op.drop_table("fleet_secrets")
    op.drop_table("api_keys")
    op.drop_table("tenants")
