"""Transforms: a model run over the records of files (DESIGN §14). Its shards are ordinary jobs
(`jobs.transform_id`, `jobs.shard`); this row holds what they share and their counts."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import Base, UTCDateTime


class TransformStatus(enum.StrEnum):
    QUEUED = "queued"  # no shard has ended yet
    RUNNING = "running"  # some shards ended, others have not
    # Every shard ended well; bad records do not fail it: counted in `records_failed`, listed in
    # its errors files.
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # every shard ended, some failed for good (retry runs those again)
    CANCELED = "canceled"  # canceled by its client: queued shards never start

    @property
    def finished(self) -> bool:
        return self in TRANSFORM_FINISHED


TRANSFORM_FINISHED = frozenset(
    {TransformStatus.SUCCEEDED, TransformStatus.FAILED, TransformStatus.CANCELED}
)


class Transform(Base):
    """A transform of a tenant's files by a model version: its spec, its input files as they
    were inspected at submit, and the counts its shards add as they end (db/transforms.py)."""

    __tablename__ = "transforms"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # a job id's layout (UUIDv7)
    tenant: Mapped[str] = mapped_column(
        String(64), ForeignKey("tenants.name", name="fk_transforms_tenant")
    )
    model: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=TransformStatus.QUEUED.value)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    # {"input": {uri, format, columns, key}, "output": {uri, format}, "shard_records"}
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # [{"uri", "info": FileInfo.to_json()}] in input order: what the shards read.
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    output_uri: Mapped[str] = mapped_column(Text)
    errors_uri: Mapped[str | None] = mapped_column(Text)
    records: Mapped[int] = mapped_column(BigInteger)
    records_succeeded: Mapped[int] = mapped_column(BigInteger, default=0)
    records_failed: Mapped[int] = mapped_column(BigInteger, default=0)
    shards_total: Mapped[int] = mapped_column(Integer)
    shards_done: Mapped[int] = mapped_column(Integer, default=0)
    shards_failed: Mapped[int] = mapped_column(Integer, default=0)
    # Where its webhook goes and which events it asked for, as a job's (`db.webhooks.Event`).
    webhook: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Its request's `Idempotency-Key` (unique per tenant) and the sha256 of what it asked for,
    # which a request sent again under that key must match (api/routes/transforms.py).
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_transforms_tenant_id", "tenant", "id"),  # a tenant's listing, newest first
        UniqueConstraint("tenant", "idempotency_key", name="uq_transforms_tenant_idempotency_key"),
    )
