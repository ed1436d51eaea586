"""A job's JSON form, as `GET /v1/jobs/{id}` shows it: the API's answers (api/schemas.py) and the
bodies of its webhooks (worker/webhooks.py) are built here, so the two never differ."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row

from db.models import FINISHED, Job, JobStatus
from db.standing import Standing
from db.usage import usage_out
from tffleet import tensors
from tffleet.announcements import EndedJob

OUTPUT_URI_PREFIX = "tffleet://jobs/"
_ENDED = frozenset(status.value for status in FINISHED)


def iso_utc(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def job_out(
    job: Job | Row[Any] | EndedJob,
    *,
    encoding: str = "json",
    with_outputs: bool = True,
    standing: Standing | None = None,
) -> dict[str, Any]:
    """The JSON form of a job (an ORM object, a plain row, or the job as its worker announced
    it), with where it stands if it is queued (`db.standing.place`). Built by hand: a poll's hot
    path."""
    outputs = None
    if with_outputs and job.status == JobStatus.SUCCEEDED.value and job.outputs is not None:
        outputs = outputs_out(job.id, job.outputs, encoding=encoding)
    return {
        "id": job.id,
        "model": job.model,
        "version": job.version,
        "status": job.status,
        "priority": job.priority,
        "created_at": iso_utc(job.created_at),
        "started_at": iso_utc(job.started_at),
        "finished_at": iso_utc(job.finished_at),
        "attempts": job.attempts,
        "error": (
            {"code": job.error_code, "message": job.error_message or ""} if job.error_code else None
        ),
        "outputs": outputs,
        "worker": job.worker,
        "progress": _progress(job),
        "cached": bool(getattr(job, "cached", False)),
        **standing_fields(standing),
        "deadline_at": iso_utc(job.deadline_at),
        "queue_timeout_at": iso_utc(job.queue_timeout_at),
        "usage": _usage(job),
    }


def outputs_out(job_id: str, blob: bytes, *, encoding: str = "json") -> dict[str, Any]:
    """A succeeded job's outputs in JSON: each held in its blob as a tensor (`encoding`), each
    held in the object store (too big to inline, DESIGN §13) as a reference that
    `GET /v1/jobs/{id}/outputs/{name}` streams: `{"uri", "dtype", "shape"}`. Nothing is read
    from the store here, so a poll costs the same whatever the outputs weigh."""
    outputs: dict[str, Any] = {
        name: tensors.encode(array, encoding=encoding)
        for name, array in tensors.unpack(blob, inline_only=True).items()
    }
    for name, ref in tensors.references(blob).items():
        outputs[name] = {
            "uri": output_uri(job_id, name),
            "dtype": ref.dtype,
            "shape": list(ref.shape),
        }
    return outputs


def output_uri(job_id: str, name: str) -> str:
    """What names a job's output held in the store: the route's path, as a `tffleet://` URI
    (as uploads are named), never the store's own key, which says where the fleet keeps it."""
    return f"{OUTPUT_URI_PREFIX}{job_id}/outputs/{name}"


def standing_fields(standing: Standing | None) -> dict[str, Any]:
    """`queue_position` and `eta_s` of a queued job (`db.standing`); null for any other."""
    if standing is None:
        return {"queue_position": None, "eta_s": None}
    eta = standing.eta_s
    return {
        "queue_position": standing.queue_position,
        "eta_s": None if eta is None else round(eta, 3),
    }


def _usage(job: Job | Row[Any] | EndedJob) -> dict[str, Any] | None:
    """What an ended job cost (db/usage.py); None until it ends."""
    if job.status not in _ENDED:
        return None
    return usage_out(
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        device_s=job.device_s,
        samples=job.samples,
    )


def _progress(job: Job | Row[Any] | EndedJob) -> dict[str, int] | None:
    """How far a job split into parts has come (db/parts.py); None for any other job."""
    if getattr(job, "parts", None) is None:
        return None
    return {"samples": job.samples, "samples_done": job.samples_done or 0}  # type: ignore[union-attr]
