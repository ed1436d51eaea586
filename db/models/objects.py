"""What the database knows of the object store (uploads, the jobs naming them, garbage), and
the response cache."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import Base, UTCDateTime


class Upload(Base):
    """A tensor a client put in the object store (POST /v1/uploads) for jobs to name by URI,
    kept until `expires_at` and while a job naming it keeps its inputs (db/objects.py)."""

    __tablename__ = "uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # 32 hex
    tenant: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(Text)
    size: Mapped[int | None] = mapped_column(BigInteger)  # null: a presigned PUT, unchecked
    dtype: Mapped[str | None] = mapped_column(String(16))
    shape: Mapped[list[int] | None] = mapped_column(JSON)
    # An .npz's arrays (dtype, shape null): name -> {dtype, shape, offset, nbytes} of its data.
    members: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)  # ix_uploads_expires_at


class JobUpload(Base):
    """A job whose inputs name an upload. No foreign key to it: the upload may go first."""

    __tablename__ = "job_uploads"

    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    upload_id: Mapped[str] = mapped_column(String(32), primary_key=True)

    __table_args__ = (Index("ix_job_uploads_upload_id", "upload_id"),)


class ObjectGarbage(Base):
    """An object (or a prefix's) to delete from the store, due at `not_before` (db/objects.py)."""

    __tablename__ = "object_garbage"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(Text, index=True)
    prefix: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime())  # null: due now


class CacheEntry(Base):
    """A succeeded job's outputs, by the hash of its model version, tenant (or "*" where the
    model's cache is shared) and packed inputs: the response cache (db/cache.py)."""

    __tablename__ = "job_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    outputs: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    # The sweeper's purge: oldest first, and the bytes of all entries (`size` in the index, so
    # PostgreSQL sums it from the index alone, not from the table and its outputs).
    __table_args__ = (Index("ix_job_cache_created_at", "created_at", "size"),)
