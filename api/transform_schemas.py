"""A transform's shapes in and out (DESIGN §14): `TransformCreate` comes in, `TransformOut` goes
out (built by db/transform_views.py, which its webhook shares). Beside api/schemas.py, the jobs'."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.schemas import JobUsage, events_with_webhook, webhook_url
from db.models import TransformStatus
from tffleet import webhooks

InputFormat = Literal["parquet", "tfrecord", "csv", "jsonl", "npy"]
OutputFormat = Literal["parquet", "jsonl", "npy"]


class TransformInput(BaseModel):
    """What a transform reads: files by URI, their format, which column feeds which input."""

    model_config = ConfigDict(extra="forbid")

    uri: str | list[str] = Field(
        description="A file, a prefix (ending in `/`: the files under it, in sorted order) or a "
        "list of files: `tffleet://datasets/<path>` (the fleet's store, your tenant's), or under "
        "a `file://` or `s3://` prefix the fleet allows (TFFLEET_TRANSFORM_LOCATIONS)."
    )
    format: InputFormat | None = Field(
        default=None, description="Default: what the files' names say (`.parquet`, `.csv`, ...)."
    )
    columns: dict[str, str] | None = Field(
        default=None,
        description="`{input: column}`; an input left out is fed by the column of its name (a "
        "one-input model reading a one-column file takes that column).",
    )
    key: str | None = Field(
        default=None,
        max_length=256,
        description="A column carried to each output row and error (default: the record index).",
    )

    @field_validator("uri")
    @classmethod
    def _uris(cls, uri: str | list[str]) -> str | list[str]:
        uris = [uri] if isinstance(uri, str) else uri
        if not 1 <= len(uris) <= 10_000:
            raise ValueError("name 1 to 10000 files")
        for each in uris:
            if not 1 <= len(each) <= 2048 or "\x00" in each:
                raise ValueError(f"{each[:80]!r}: a URI of 1 to 2048 characters")
        return uri

    @field_validator("columns")
    @classmethod
    def _columns(cls, columns: dict[str, str] | None) -> dict[str, str] | None:
        for name, column in (columns or {}).items():
            if not 0 < len(column) <= 256 or not 0 < len(name) <= 256:
                raise ValueError(f"{name!r}: input and column names of 1 to 256 characters")
        return columns


class TransformOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="A prefix its parts go under (`part-00000.parquet`, ...; bad records under "
        "`errors/`); default `tffleet://transforms/<id>/`, the fleet's store.",
    )
    format: OutputFormat = "parquet"


class TransformCreate(BaseModel):
    """A transform as submitted: a model run over every record of some files."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    version: int | None = Field(default=None, ge=1, le=2**31 - 1)
    input: TransformInput
    output: TransformOutput = Field(default_factory=lambda: TransformOutput())
    shard_records: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Records per shard (one job, one part file); default "
        "TFFLEET_TRANSFORM_SHARD_RECORDS, at most the tenant's samples per job.",
    )
    batch_records: int | None = Field(
        default=None,
        ge=1,
        le=65_536,
        description="Records a shard reads and maps at a time (one batch of its input "
        "pipeline); each forward pass runs at most the model's `max_batch_size` of them. "
        "Default: the model's `max_batch_size`.",
    )
    priority: int | None = Field(
        default=None,
        ge=-1000,
        le=1000,
        description="Its shards' priority; default TFFLEET_TRANSFORM_PRIORITY, below "
        "interactive jobs.",
    )
    webhook: str | None = Field(
        default=None,
        max_length=webhooks.MAX_URL_LENGTH,
        description="An http(s) URL that gets the transform, signed (Standard Webhooks), when "
        "it ends (event `transform`).",
    )
    webhook_events: list[Literal["completed"]] | None = Field(
        default=None, min_length=1, max_length=1, description='Only `["completed"]`.'
    )

    _webhook_url = field_validator("webhook")(webhook_url)
    _events_with_webhook = field_validator("webhook_events")(events_with_webhook)


class TransformCounts(BaseModel):
    records: int = Field(description="Records of its input files.")
    succeeded: int = Field(description="Records with outputs in its part files.")
    failed: int = Field(description="Bad records, each in its errors files with its reason.")


class TransformShards(BaseModel):
    total: int
    done: int = Field(description="Shards whose part is written.")
    failed: int = Field(description="Shards that failed for good (retry runs them again).")
    running: int


class TransformFiles(BaseModel):
    uri: str
    format: OutputFormat
    files: list[str] = Field(description="The part files written so far, in input order.")


class TransformOut(BaseModel):
    """A transform as the API shows it."""

    id: str
    status: TransformStatus
    model: str
    version: int
    priority: int
    counts: TransformCounts
    shards: TransformShards
    progress: float = Field(description="Records ended (and done by running shards) over all.")
    eta_s: float | None = Field(description="Seconds left at its pace so far; null if unknown.")
    output: TransformFiles
    errors_uri: str | None = Field(description="The folder of its errors files.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    usage: JobUsage | None = Field(
        default=None,
        description="Once it ended: its shards' device seconds summed, its records as samples, "
        "and its time queued (to its first shard's start) and running.",
    )


class TransformList(BaseModel):
    transforms: list[TransformOut]
    next_cursor: str | None
