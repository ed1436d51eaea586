"""Jobs: their statuses and error codes, their rows and their packed inputs."""

from __future__ import annotations

import enum
from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    select,
    text,
)
from sqlalchemy.orm import Mapped, column_property, deferred, mapped_column

from db.models.base import Base, UTCDateTime
from db.models.tenants import DEFAULT_TENANT


class JobStatus(enum.StrEnum):
    QUEUED = "queued"  # stored and waiting for a worker (a wake-up may or may not be in Redis)
    RUNNING = "running"  # claimed by a worker under a lease
    SUCCEEDED = "succeeded"  # outputs written under the lease
    FAILED = "failed"  # ended with an error code; never retried again
    # Canceled by a client, past its deadline, or not started within its queue time-out; a late
    # result is discarded.
    CANCELED = "canceled"

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})

# A job's `pick_deadline` without a deadline: after every real one. Written as SQLAlchemy writes
# a time to SQLite (the server default's text must sort and compare as the bound value does).
NO_DEADLINE = datetime(9999, 12, 31, tzinfo=UTC)
_NO_DEADLINE_SQL = "'9999-12-31 00:00:00.000000'"


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
    # Nor this: a job `canceled` because no worker started it within its `Queue-Timeout`.
    QUEUE_TIMEOUT = "queue_timeout"


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
    # A shard of a transform (db/transforms.py): its transform, and its number there. Its inputs
    # blob is then a shard spec (which records of which file), not packed tensors.
    transform_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("transforms.id", name="fk_jobs_transform_id", ondelete="CASCADE")
    )
    shard: Mapped[int | None] = mapped_column(Integer)
    # What it cost (issue 30, DESIGN.md section 15): its share, by samples, of each forward
    # pass it took part in, in seconds; null until it ran. A split job's parent sums its parts'.
    device_s: Mapped[float | None] = mapped_column(Float)
    # `Queue-Timeout` at submit (or retry): not started by then, it ends `canceled`
    # (`queue_timeout`) without running; the claim skips it and the sweeper ends it. A job that
    # started once (`started_at`) and went back to the queue is past it.
    queue_timeout_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Where the claim puts it among its tenant's queued jobs of its priority: its `deadline_at`
    # (earliest first), or NO_DEADLINE (after them, by age). Its own column, not `deadline_at`:
    # SQLite sorts nulls first, PostgreSQL last, and `ix_jobs_pick` must hold the claim's order
    # on both (tests/db/test_claim_plan.py).
    pick_deadline: Mapped[datetime] = mapped_column(
        UTCDateTime(), default=NO_DEADLINE, server_default=text(_NO_DEADLINE_SQL)
    )

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
        # The sweeper's deadlines: unfinished jobs past theirs. Only the jobs that have one:
        # the others' status changes write nothing here (the sweeper's `deadline_at <= now`
        # implies the index's condition, so both databases use it).
        Index(
            "ix_jobs_deadline",
            "status",
            "deadline_at",
            sqlite_where=text("deadline_at IS NOT NULL"),
            postgresql_where=text("deadline_at IS NOT NULL"),
        ),
        Index("ix_jobs_transform_id", "transform_id"),
        # The sweeper's queue time-outs: queued jobs past theirs (likewise only those with one).
        Index(
            "ix_jobs_queue_timeout",
            "status",
            "queue_timeout_at",
            sqlite_where=text("queue_timeout_at IS NOT NULL"),
            postgresql_where=text("queue_timeout_at IS NOT NULL"),
        ),
        # The sweeper's `stamp_expiry`: jobs with a `ttl_s` of their own not yet given their
        # `expires_at` (a few). Without it the sweeper read every job lacking an `expires_at`
        # (nearly all) each sweep, under SQLite's write lock, longer as the table grew.
        # `expires_at` (null here) leads so that SQLite's planner prefers it to that index.
        Index(
            "ix_jobs_ttl_unstamped",
            "expires_at",
            "status",
            sqlite_where=text("ttl_s IS NOT NULL AND expires_at IS NULL"),
            postgresql_where=text("ttl_s IS NOT NULL AND expires_at IS NULL"),
        ),
    )


# The worker's claim: which tenants have queued jobs of a model version, then each one's by
# priority (highest first), deadline (earliest first, none last) and age, read in index order
# (db.jobs.claim_next): an ascending priority made PostgreSQL sort a tenant's whole queue on
# every claim.
Index(
    "ix_jobs_pick",
    Job.model,
    Job.version,
    Job.status,
    Job.tenant,
    Job.priority.desc(),
    Job.pick_deadline,
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
