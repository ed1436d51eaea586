"""Tenants, their API keys, and the secrets the fleet's own processes share."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import Base, UTCDateTime

# The tenant of jobs stored before tenants existed, and of every request while auth is off.
DEFAULT_TENANT = "default"


class Tenant(Base):
    """Who jobs belong to. Its API keys (`ApiKey`) act for it; its limits cap what it may ask.

    A limit left null is the fleet's default from settings (TFFLEET_TENANT_*)."""

    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Its share of a model's batches when several tenants wait (fair share), relative to others'.
    weight: Mapped[int] = mapped_column(Integer, default=1)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer)
    max_samples_per_job: Mapped[int | None] = mapped_column(Integer)
    max_priority: Mapped[int | None] = mapped_column(Integer)
    max_ttl_s: Mapped[int | None] = mapped_column(Integer)
    # Signs its webhooks (Standard Webhooks, `whsec_...`); made on first use (db/webhooks.py).
    webhook_secret: Mapped[str | None] = mapped_column(String(64))


class FleetSecret(Base):
    """A secret the fleet's own processes share through the database, which only they reach
    (`db.secrets`): the key that signs completion announcements, say."""

    __tablename__ = "fleet_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(128))


class ApiKey(Base):
    """An API key: `tff_<prefix>_<secret>`. Only the sha256 of the whole key is stored; the
    prefix finds the row, and the digests are compared in constant time."""

    __tablename__ = "api_keys"

    prefix: Mapped[str] = mapped_column(String(16), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), ForeignKey("tenants.name"))
    digest: Mapped[str] = mapped_column(String(64))  # sha256 hex of the whole key
    admin: Mapped[bool] = mapped_column(Boolean, default=False)  # sees and manages every tenant
    note: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Its limits (`tffleet keys create|set`), each null for none: jobs per second with a burst,
    # queued plus running jobs at once, and the models it may use (a JSON array of names).
    rate_per_s: Mapped[float | None] = mapped_column(Float)
    rate_burst: Mapped[int | None] = mapped_column(Integer)
    max_active_jobs: Mapped[int | None] = mapped_column(Integer)
    allowed_models: Mapped[str | None] = mapped_column(Text)
