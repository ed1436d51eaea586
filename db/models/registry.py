"""Model versions and their signatures; which worker children hold which."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from db.models.base import Base, UTCDateTime


class ModelVersion(Base):
    """A model version some worker (or `tffleet models register`) has loaded: its signature."""

    __tablename__ = "model_versions"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    format: Mapped[str] = mapped_column(String(32))
    # {input name: {"dtype": "float32", "shape": [-1, 1024]}}; -1 marks a free dimension.
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    outputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Set when a worker replaced it with a newer version (model.toml `versions`): new submissions
    # naming it are refused while its queued jobs drain. Cleared when a worker loads it again.
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class PresenceState(enum.StrEnum):
    LOADING = "loading"  # being loaded and warmed up; takes no jobs yet
    LOADED = "loaded"  # takes jobs
    DRAINING = "draining"  # runs the jobs it still has, then is unloaded
    FAILED = "failed"  # could not be loaded (see `error`); retried when its files change


class ModelPresence(Base):
    """One worker child's hold on one model version, reported every TFFLEET_MODEL_POLL_S.

    A row not seen for a few polls belongs to a child that died: readers ignore it and the
    sweeper deletes it. Version 0 stands for the model itself (a model.toml that does not parse).
    """

    __tablename__ = "model_presence"

    # The child's lease owner string: host/pid/device/random.
    child: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    since: Mapped[datetime] = mapped_column(UTCDateTime())
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The share of the last minute (0 to 1) the child's device spent running this version's
    # forward passes, as of `seen_at`; null until the child has a minute's reports.
    busy: Mapped[float | None] = mapped_column(Float)
    # The last report (by the database's clock) at which the child had taken work of this
    # version since its report before: claimed jobs of it, or was running a task of it. Null
    # until it has. db/backlog.py reads it for `stalled_s`: consumers connected, not consuming.
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_model_presence_model", "name", "version", "seen_at"),
        Index("ix_model_presence_seen_at", "seen_at"),
    )
