"""Usage over time: what the jobs that ended cost, by hour, tenant and model.

A job's own `usage` lives on its row (`Job.device_s` and its times), which the sweeper purges
with the job; these rows outlive it, so `GET /v1/usage` can sum a period long after its jobs are
gone. Rows are appended as jobs end (one per batch, tenant and model, not one per job) and may
repeat a (bucket, tenant, model): readers sum them, and the sweeper may fold old ones together.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import Base, UTCDateTime


class UsageRecord(Base):
    __tablename__ = "usage_records"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    bucket: Mapped[datetime] = mapped_column(UTCDateTime())  # the hour it ended in, its start
    tenant: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    jobs: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(BigInteger)
    device_s: Mapped[float] = mapped_column(Float)
    queue_s: Mapped[float] = mapped_column(Float)
    run_s: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_usage_records_bucket", "bucket"),
        Index("ix_usage_records_tenant_bucket", "tenant", "bucket"),
    )
