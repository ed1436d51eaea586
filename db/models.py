"""The rows: tenants and their API keys, jobs, model versions, which worker children hold which."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property, deferred, mapped_column
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC on every backend (SQLite has no time zones); read back as aware UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None else None


class Base(DeclarativeBase):
    pass


class JobStatus(enum.StrEnum):
    QUEUED = "queued"  # stored and waiting for a worker (a wake-up may or may not be in Redis)
    RUNNING = "running"  # claimed by a worker under a lease
    SUCCEEDED = "succeeded"  # outputs written under the lease
    FAILED = "failed"  # ended with an error code; never retried again
    CANCELED = "canceled"  # canceled by a client, or past its deadline; a late result is discarded

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})


class JobErrorCode(enum.StrEnum):
    """Why a job ended `failed` (its `error.code`); worker/retry.py says which paths lead here."""

    INVALID_INPUT = "invalid_input"  # inputs that do not fit the model (a 422 at submit)
    MODEL_ERROR = "model_error"  # its forward pass raised, or its version cannot be loaded
    TIMEOUT = "timeout"  # it ran alone past the model's time limit
    WORKER_LOST = "worker_lost"  # every attempt's lease expired without a result
    INPUT_MISSING = "input_missing"  # an input's object left the store after submit (deleted)
    # Not a failure: the error of a job `canceled` because it had not ended by its deadline
    # (`Cancel-After` at submit).
    DEADLINE = "deadline"


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


class Job(Base):
    __tablename__ = "jobs"

    # Time-ordered (UUIDv7 layout), so ordering by id is ordering by submission.
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # Whose it is: the tenant of the API key that submitted it (see `Tenant`).
    tenant: Mapped[str] = mapped_column(
        String(64), ForeignKey("tenants.name", name="fk_jobs_tenant"), default=DEFAULT_TENANT
    )
    model: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    samples: Mapped[int] = mapped_column(Integer)
    outputs: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # The lease: who holds the job, on which attempt, until when. Results are fenced by it.
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    worker: Mapped[str | None] = mapped_column(String(200))
    # Unique per tenant: two tenants may use the same key without meeting.
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # When the sweeper last published a wake-up for this queued job; null when only the submit
    # did (its wake-up is then as old as created_at).
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # A retention of its own (seconds after it ends), else TFFLEET_RESULT_TTL_S; the sweeper
    # turns it into `expires_at` once the job has ended.
    ttl_s: Mapped[int | None] = mapped_column(Integer)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # A job larger than a batch, split into parts that every child may run (db/parts.py): a
    # part names its job and where its samples start; the job counts its parts and the samples
    # they finished.
    parent_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("jobs.id", name="fk_jobs_parent_id", ondelete="CASCADE")
    )
    part_offset: Mapped[int | None] = mapped_column(Integer)
    parts: Mapped[int | None] = mapped_column(Integer)
    samples_done: Mapped[int | None] = mapped_column(Integer)
    # A model with `cache = true`: the key of its inputs in `job_cache`, and whether the job was
    # answered from there, without a forward pass (db/cache.py).
    cache_key: Mapped[str | None] = mapped_column(String(64))
    cached: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # `Cancel-After` at submit (or retry): not ended by then, it is canceled (error `deadline`),
    # by the claim that would start it or by the sweeper.
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # `attempts` when a client last retried the job (POST /v1/jobs/{id}/retry): `attempts` keeps
    # counting every claim of its life (a late result of an earlier run must never match a
    # lease again), while its attempt budget (TFFLEET_MAX_ATTEMPTS) counts the claims since.
    budget_from: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Where its webhooks go, and which events it asked for (bits of `db.webhooks.Event`); both
    # null without one.
    webhook: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[int | None] = mapped_column(Integer)
    # What its other columns do not keep: each attempt's start (and its worker), each return to
    # the queue and why, each retry; a line each, appended by the UPDATE that made the change
    # (db.jobs.history_of reads it). Only the console reads it: deferred.
    history: Mapped[str | None] = mapped_column(Text, deferred=True)
    # Bytes it owns in the object store, under `<tenant>/jobs/<id>/`; null: none (db/objects.py).
    stored_bytes: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
        # A tenant's listing, newest first; its queued jobs (quotas, fair share).
        Index("ix_jobs_tenant_id", "tenant", "id"),
        Index("ix_jobs_tenant_status", "tenant", "status"),
        Index("ix_jobs_status_id", "status", "id"),
        Index("ix_jobs_lease", "status", "lease_expires_at"),
        # The sweeper's purge: finished jobs, oldest first.
        Index("ix_jobs_finished_at", "finished_at"),
        Index("ix_jobs_expires_at", "expires_at"),
        Index("ix_jobs_parent_id", "parent_id"),
        # The sweeper's deadlines: unfinished jobs past theirs.
        Index("ix_jobs_deadline", "status", "deadline_at"),
    )


# The worker's claim: which tenants have queued jobs of a model version, then each one's by
# priority (highest first) then age, read in index order (db.jobs.claim_next): an ascending
# priority made PostgreSQL sort a tenant's whole queue on every claim.
Index(
    "ix_jobs_pick",
    Job.model,
    Job.version,
    Job.status,
    Job.tenant,
    Job.priority.desc(),
    Job.id,
)


class JobInput(Base):
    """A job's packed inputs, in a table of their own: claiming or finishing a job updates its
    `jobs` row, and SQLite rewrites a whole row on update, blob and all."""

    __tablename__ = "job_inputs"

    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    data: Mapped[bytes] = mapped_column(LargeBinary)


# Read-only on Job, for convenience; db.jobs writes job_inputs rows itself.
Job.inputs = deferred(
    column_property(select(JobInput.data).where(JobInput.job_id == Job.id).scalar_subquery())
)


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

    __table_args__ = (
        Index("ix_model_presence_model", "name", "version", "seen_at"),
        Index("ix_model_presence_seen_at", "seen_at"),
    )


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
