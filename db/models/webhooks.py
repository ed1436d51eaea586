"""The webhook outbox: one row per event a webhook asked for."""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import Base, UTCDateTime


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"  # to be sent: at `next_attempt_at`, by whoever leases it
    DELIVERED = "delivered"  # a receiver answered 2xx
    GIVEN_UP = "given_up"  # past TFFLEET_WEBHOOK_RETRY_S, or its job was deleted first


class WebhookDelivery(Base):
    """One event of a job for its webhook: the outbox (db/webhooks.py). Written in the
    transaction that changed the job; sent, retried and recorded by worker/webhooks.py.

    The job as it was at the event (`job_*`) is kept beside it, its outputs excepted: the body
    is built at delivery from the job's row with these laid over it (outputs are a succeeded
    job's, which never change). No foreign key: a job deleted before its delivery leaves the
    row behind, and the deliverer records that it gave up."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # the `webhook-id`
    job_id: Mapped[str] = mapped_column(String(36))
    tenant: Mapped[str] = mapped_column(String(64))
    event: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default=DeliveryStatus.PENDING.value)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Who is sending it now, until when: another deliverer leaves it alone meanwhile.
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(Text)
    last_status: Mapped[int | None] = mapped_column(Integer)  # the receiver's HTTP status
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # When the event happened (the job's `started_at` or `finished_at`): one row per event.
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    job_status: Mapped[str] = mapped_column(String(16))
    job_attempts: Mapped[int] = mapped_column(Integer)
    job_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    job_finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    job_error_code: Mapped[str | None] = mapped_column(String(64))
    job_error_message: Mapped[str | None] = mapped_column(Text)
    job_deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("job_id", "event", "at", name="uq_webhook_deliveries_event"),
        # The deliverer: due rows of each tenant, oldest first; the purge of ended ones.
        Index("ix_webhook_deliveries_due", "status", "tenant", "next_attempt_at"),
        Index("ix_webhook_deliveries_created_at", "created_at"),
    )
