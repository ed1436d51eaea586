"""Data shapes: `JobCreate` comes in, `JobOut` goes out (a `Job` row is the database's; its JSON
form, `job_out`, lives in db/views.py, which the webhook deliverer shares)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from api.ids import JOB_ID_MAX_LENGTH
from db.models import JobStatus
from tffleet import webhooks

Tensor = list[Any] | dict[str, Any]


def webhook_url(url: str | None) -> str | None:
    """A `webhook` field's validator (jobs' and transforms'): the URL parsed as deliveries will
    parse it, so a bad one is refused at submission (a WebhookAddressError is a ValueError: a
    422 naming the field), not found out at the first delivery."""
    if url is not None:
        webhooks.parse_url(url)
    return url


def events_with_webhook(events: list[str] | None, info: ValidationInfo) -> list[str] | None:
    """A `webhook_events` field's validator: events asked for with no `webhook` are a 422, not
    a setting silently dropped."""
    if events is not None and info.data.get("webhook") is None:
        raise ValueError("needs a `webhook` to send them to")
    return events


class JobCreate(BaseModel):
    """A job as submitted: which model, and its inputs by name (or one bare tensor)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # At most PostgreSQL's INTEGER: a larger one is no version, and the query would fail.
    version: int | None = Field(default=None, ge=1, le=2**31 - 1)
    inputs: dict[str, Any] | list[Any] = Field(
        description="Tensors by input name: nested lists, a binary envelope `{b64, dtype, "
        'shape}`, or `{"uri": "tffleet://uploads/<id>"}`, an upload of the caller\'s tenant '
        "(POST /v1/uploads)."
    )
    priority: int = Field(default=0, ge=-1000, le=1000)
    ttl_s: int | None = Field(
        default=None,
        ge=1,
        le=366 * 24 * 3600,
        description="Keep the job and its result this long after it ends (default: the server's).",
    )
    webhook: str | None = Field(
        default=None,
        max_length=webhooks.MAX_URL_LENGTH,
        description="An http(s) URL that gets the job, signed (Standard Webhooks), on the "
        "events of `webhook_events`; a public address unless the fleet allows private ones.",
    )
    webhook_events: list[Literal["start", "completed"]] | None = Field(
        default=None,
        min_length=1,
        max_length=2,
        description="With `webhook`: `start` (each run attempt starts) and `completed` (it "
        'ended: succeeded, failed or canceled). Default `["completed"]`.',
    )

    _webhook_url = field_validator("webhook")(webhook_url)

    @field_validator("webhook_events")
    @classmethod
    def _events_with_webhook(
        cls, events: list[str] | None, info: ValidationInfo
    ) -> list[str] | None:
        events = events_with_webhook(events, info)
        return None if events is None else sorted(set(events))


class JobBatchCreate(BaseModel):
    """Many jobs in one request: all are validated before any is stored."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobCreate] = Field(min_length=1, max_length=10_000)


# An id in a body: bounded as a path's `JobId` is (api/ids.py). One with NUL is left out of the
# read (api/ingest.py JobReader) and so reported not found with the others.
BodyJobId = Annotated[str, Field(max_length=JOB_ID_MAX_LENGTH)]


class JobStatusQuery(BaseModel):
    """A bulk status read: these jobs, in this order."""

    model_config = ConfigDict(extra="forbid")

    ids: list[BodyJobId] = Field(min_length=1, max_length=10_000)
    wait: float = Field(
        default=0,
        ge=0,
        le=30,
        description="Hold until one of the unfinished jobs ends (see `until`), seconds.",
    )
    until: Literal["any", "all"] = Field(
        default="any",
        description="With `wait`: answer once one of the unfinished jobs ends (`any`), or once "
        "every one has (`all`: a client waiting for all of them asks once, not once a batch).",
    )
    encoding: Literal["json", "b64"] = "json"

    @field_validator("ids")
    @classmethod
    def _each_once(cls, ids: list[str]) -> list[str]:
        # A repeated id would repeat its outputs in the answer: one request costing the API far
        # more than it carries.
        repeated = [job_id for job_id, n in Counter(ids).items() if n > 1]
        if repeated:
            raise ValueError(f"list each id once; {repeated[0]!r} is listed more than once")
        return ids


class JobError(BaseModel):
    code: str
    message: str


class JobProgress(BaseModel):
    samples: int
    samples_done: int


class JobUsage(BaseModel):
    """What an ended job cost (DESIGN §15)."""

    queue_s: float = Field(description="Queued: from its creation to its start (its end if none).")
    run_s: float = Field(description="Running: from its start to its end (0 if it never ran).")
    device_s: float = Field(
        description="Its share, by samples, of each forward pass it took part in, in device "
        "seconds (0 if it never ran); a split job's is its parts' summed."
    )
    samples: int


class JobOut(BaseModel):
    """A job as the API shows it."""

    id: str
    model: str
    version: int
    status: JobStatus
    priority: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    error: JobError | None
    outputs: dict[str, Tensor] | None
    worker: str | None = Field(default=None, description="The worker child that ran it last.")
    progress: JobProgress | None = Field(
        default=None,
        description="A job larger than a batch, split across children: samples done so far.",
    )
    cached: bool = Field(
        default=False,
        description="Answered from the response cache: a job with equal inputs had succeeded.",
    )
    queue_position: int | None = Field(
        default=None,
        description="While queued: how many queued jobs of its model version the workers take "
        "before it (by fair share between tenants, then priority and age; an estimate).",
    )
    eta_s: float | None = Field(
        default=None,
        description="While queued: seconds until it may end, at its model version's recent "
        "pace; null when none of it finished lately.",
    )
    deadline_at: datetime | None = Field(
        default=None,
        description="Its `Cancel-After`: not ended by then, it is canceled (error `deadline`).",
    )
    queue_timeout_at: datetime | None = Field(
        default=None,
        description="Its `Queue-Timeout`: not started by then, it is canceled (error "
        "`queue_timeout`).",
    )
    usage: JobUsage | None = Field(
        default=None, description="Once it ended: what it cost (null until then)."
    )


class ErrorDetail(BaseModel):
    code: str
    message: str = Field(description="Names the field at fault.")


class ErrorOut(BaseModel):
    """Every error response: `{"error": {"code", "message"}}`."""

    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a route may answer with; 401 for all of them
    (every route that answers an error of its own takes an API key)."""
    described = {
        400: "Malformed JSON or header.",
        401: "No API key, or an unknown or revoked one.",
        403: "A route for admin keys, called with a tenant's key; or a model the key may not "
        "use (`model_not_allowed`).",
        404: "Unknown model, version or job.",
        409: "The job already finished (or has not: retry, delete), or an Idempotency-Key was "
        "reused with another body.",
        410: "The job's inputs are no longer stored.",
        413: "Body over the size limit.",
        415: "Body not application/json.",
        422: "Inputs or parameters that do not fit.",
        429: "Queue full, the tenant's quota, or the key's rate or cap on active jobs "
        "(`rate_limited`); see Retry-After.",
        503: "Database or broker unreachable.",
    }
    return {
        status: {"model": ErrorOut, "description": described[status]}
        for status in sorted({401, *statuses})
    }


class UploadOut(BaseModel):
    """An upload as stored: the URI a job names it by, and until when it is kept."""

    uri: str = Field(description='`tffleet://uploads/<id>`: write `{"uri": ...}` as an input.')
    upload_url: str | None = Field(
        description="With `?presign=true`: PUT the .npy here (an S3 store's presigned URL)."
    )
    expires_at: datetime = Field(
        description="Kept until then (TFFLEET_UPLOAD_TTL_S), and while a job naming it keeps "
        "its inputs."
    )
    dtype: str | None = Field(description="Null until a presigned upload is first referenced.")
    shape: list[int] | None
    size: int | None = Field(description="The .npy's bytes, header included.")
    members: dict[str, TensorSpecOut] | None = Field(
        default=None,
        description="An .npz's arrays by name (dtype and shape above are null): a job names "
        "one as `tffleet://uploads/<id>/<name>`, or by the upload's URI for an input of its name.",
    )


class JobBatchOut(BaseModel):
    jobs: list[JobOut]


class JobList(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None


class TensorSpecOut(BaseModel):
    dtype: str
    shape: list[int] | None


class ModelWorkerOut(BaseModel):
    """A live worker child's hold on a model version."""

    worker: str = Field(description="The worker child, as jobs name it: host/pid/device/id.")
    host: str
    pid: int
    device: str
    state: Literal["loading", "loaded", "draining", "failed"] = Field(
        description="`loaded`: takes jobs; `draining`: runs the jobs it has, then unloads it."
    )
    since: datetime


class ModelOut(BaseModel):
    name: str
    version: int
    format: str
    inputs: dict[str, TensorSpecOut]
    outputs: dict[str, TensorSpecOut]
    config: dict[str, Any]
    registered_at: datetime = Field(
        description="When a worker last loaded it (or it was registered)."
    )
    latest: bool = Field(description="Submissions without a version get this one.")
    served: bool = Field(description="Some live worker takes new jobs of it.")
    retired: bool = Field(
        description="A newer version replaced it: new jobs naming it are refused (404) while "
        "its queued ones drain."
    )
    retired_at: datetime | None
    workers: list[ModelWorkerOut] = Field(
        description="The live workers that load, hold or drain it; empty: no live worker."
    )
    queued: int = Field(description="Its jobs waiting for a worker.")
    running: int


class ModelLoadErrorOut(ModelWorkerOut):
    """A model version a live worker child could not load."""

    model: str
    version: int | None = Field(description="null: the model's model.toml itself.")
    path: str
    error: str


class ModelList(BaseModel):
    models: list[ModelOut]
    load_errors: list[ModelLoadErrorOut]


def json_response(content: Any, status_code: int = 200) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
    )
