"""What the protocol facades (TF Serving REST, the Open Inference Protocol) share.

A facade's request becomes one job of the caller's tenant, checked and stored as `POST /v1/jobs`
stores one, batched with everyone else's traffic, and the answer waits for it, up to
`TFFLEET_PROTOCOL_WAIT_S`; past that the answer is 504 naming the job, which runs on and is
polled at `/v1/jobs/{id}`. Both protocols write an error as `{"error": "message"}`.

Large inputs go where a native job's go (api/references.py): an input over
TFFLEET_INLINE_MAX_BYTES is written to the object store before its job's row, and an input
given by reference (`{"uri": "tffleet://uploads/<id>"}`, where the protocol's JSON has room for
one) points at its upload; neither puts its bytes in the database.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import SQLAlchemyError

from api import references
from api.ingest import BLOB
from api.metrics import REQUESTS_REJECTED
from api.schemas import JobCreate, json_response
from api.state import AppState
from api.submission import parse, prepare, wait_for
from db import clock, presence, registry
from db.models import JobStatus, ModelVersion
from db.tenants import Caller
from tffleet import tensors
from tffleet.errors import (
    InvalidInput,
    InvalidRequest,
    ModelNotFound,
    OutputsGone,
    ServiceUnavailable,
    TffleetError,
)
from tffleet.objectstore import ObjectMissing

_ERROR = {"content": {"application/json": {"example": {"error": "message"}}}}
_TEXT = {
    400: "A malformed request, or inputs that do not fit the model's signature.",
    401: "No API key, or an unknown or revoked one.",
    404: "Unknown model or version.",
    409: "The job was canceled before it ended.",
    413: "Body over the size limit.",
    429: "The queue, or the tenant's quota, is full.",
    500: "The job failed in the worker; the message names it.",
    503: "Database or broker unreachable.",
    504: "The job has not ended within TFFLEET_PROTOCOL_WAIT_S; the message names it.",
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` of a facade's route: each status with the protocol's error shape."""
    return {status: {"description": _TEXT[status], **_ERROR} for status in statuses}


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    response = json_response({"error": message}, status)
    response.headers.update(headers or {})
    return response


def rejected(exc: TffleetError) -> Response:
    """A tffleet error in the protocols' shape. Inputs that do not fit the signature are 400
    there (INVALID_ARGUMENT), not the job API's 422."""
    REQUESTS_REJECTED.labels(code=exc.code).inc()
    status = 400 if isinstance(exc, InvalidInput) else exc.status_code
    return error(status, exc.message, exc.headers)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_MAX_VERSION = 2**31 - 1  # PostgreSQL's INTEGER


def model_ref(name: str, version: str | None) -> tuple[str, int | None]:
    """A model and version from a route's path: 404 for a name no model can have, 400 for a
    version that is not a positive integer."""
    if not _NAME.match(name):
        raise ModelNotFound(f"model: no model named {name!r} is registered")
    if version is None:
        return name, None
    if not version.isascii() or not version.isdigit() or not 1 <= int(version) <= _MAX_VERSION:
        raise InvalidRequest(f"version: expected a positive integer, got {version!r}")
    return name, int(version)


def versions(state: AppState, model: str) -> list[tuple[ModelVersion, bool]]:
    """The model's registered versions, oldest first, each with whether a live worker holds it;
    404 for a model that is not registered. Blocking: call it in a thread."""
    with state.reads() as session:
        since = presence.live_since(state.settings.model_poll_s, clock.now(session))
        found = registry.versions_of(session=session, name=model, live_since=since)
        if not found:
            raise registry.unknown_model(session, model)
    return found


class Unanswered(TffleetError):
    """The job ended without outputs (failed, canceled) or did not end within the wait."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status_code = status
        self.code = code


@dataclass(frozen=True)
class Answer:
    job_id: str
    model: str
    version: int
    outputs: dict[str, np.ndarray]


async def run_job(
    state: AppState,
    caller: Caller,
    *,
    model: str,
    version: int | None,
    inputs: dict[str, Any] | list[Any],
    cancel_after_s: float | None = None,
    wait_s: float | None = None,
    inline: bool = False,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> Answer:
    """Store one job of `caller`'s tenant (checked first: a bad request stores nothing) and
    wait for it: its outputs, or `Unanswered`. `inputs`: wire tensors as a JSON body gives
    them, or arrays by name, or `{"uri": ...}` references to uploads. `inline`: the inputs are
    small (the job API's bound, 64 KiB), so they are checked on the event loop when the
    signature is cached. `shapes`: the shapes the request declares for inputs it gives by
    reference (OIP's tensors have one), checked against their uploads'.

    As `POST /v1/jobs`, inputs over TFFLEET_INLINE_MAX_BYTES are written to the object store
    before the job is stored (`references.ingest`), so none of its inputs' bytes are in SQL."""
    spec = parse(JobCreate, {"model": model, "version": version, "inputs": {}})
    spec = spec.model_copy(update={"inputs": inputs})
    uris = await references.resolve(state, caller, [spec], False)
    _check_shapes(uris[0], shapes or {})
    staged = references.Staged()
    limits = await state.admission.limits(caller.tenant)
    check = functools.partial(
        prepare, state, [spec], False, caller, limits, uris=uris, staged=staged
    )
    if inline and state.signatures.cached(model, version):
        new = check(cancel_after_s=cancel_after_s)  # a thread hop would cost more
    else:
        new = await run_in_threadpool(check, cancel_after_s=cancel_after_s)
    await state.admission.admit(len(new), tenant=caller.tenant, limits=limits, caller=caller)
    wait_s = state.settings.protocol_wait_s if wait_s is None else wait_s
    ingested = await references.ingest(state, new, staged, placed=wait_s <= 0)
    job_id = ingested.jobs[0]["id"]
    try:
        (out,) = await wait_for(
            state, caller, [job_id], wait_s=wait_s, encoding=BLOB, until="all",
            known=ingested.jobs,
        )  # fmt: skip
    except SQLAlchemyError:
        raise ServiceUnavailable(
            f"job {job_id} is stored, but the database failed while waiting for it; "
            f"poll GET /v1/jobs/{job_id}"
        ) from None
    if out["status"] == JobStatus.SUCCEEDED.value:
        outputs = await _outputs(state, job_id, out["outputs"])
        return Answer(job_id, out["model"], out["version"], outputs)
    raise _unanswered(
        out, wait_s, canceled_then=cancel_after_s is not None and cancel_after_s <= wait_s
    )


def _check_shapes(
    named: Mapping[str, references.Named], shapes: Mapping[str, Sequence[int]]
) -> None:
    """400 naming the input where a request declares a shape its upload does not have."""
    for name, found in named.items():
        declared = shapes.get(name)
        if declared is not None and tuple(declared) != found.reference.shape:
            raise InvalidInput(
                f"inputs.{name}.shape: the request says {list(declared)}, its upload holds "
                f"{list(found.reference.shape)}"
            )


async def _outputs(state: AppState, job_id: str, blob: bytes) -> dict[str, np.ndarray]:
    """A succeeded job's outputs as arrays: a protocol's answer holds every value, so an output
    held in the object store (too big to inline) is read from it whole. 503 if the store does
    not answer, 410 if the object is gone."""
    objects = {}
    for name, ref in tensors.references(blob).items():
        try:
            objects[ref.key] = await state.objects.get_async(ref.key)
        except ObjectMissing:
            raise OutputsGone(
                f"job {job_id}: output {name!r} is no longer in the object store"
            ) from None
    return tensors.unpack(blob, objects)


def _unanswered(out: dict[str, Any], wait_s: float, *, canceled_then: bool) -> Unanswered:
    """Why the job has no outputs. `canceled_then`: the wait ended at the job's own deadline,
    which cancels it (if the sweeper has not yet, it does within moments)."""
    job_id, status = out["id"], out["status"]
    error = out.get("error") or {"code": "unknown", "message": ""}
    code, message = error["code"], error["message"]
    counted = f"job_{status}"  # the label of tffleet_requests_rejected_total
    timed_out = code in ("timeout", "deadline")
    if status == JobStatus.FAILED.value:
        http = 400 if code == "invalid_input" else 504 if timed_out else 500
        return Unanswered(http, counted, f"job {job_id} failed ({code}): {message}")
    if status == JobStatus.CANCELED.value:
        http = 504 if timed_out else 409
        return Unanswered(http, counted, f"job {job_id} was canceled ({code}): {message}")
    if canceled_then:
        return Unanswered(
            504,
            counted,
            f"job {job_id} has not ended within its deadline of {wait_s:g} s (it is {status}); "
            f"it is canceled (GET /v1/jobs/{job_id} shows it)",
        )
    return Unanswered(
        504,
        counted,
        f"job {job_id} has not ended within {wait_s:g} s (it is {status}); it goes on: "
        f"poll GET /v1/jobs/{job_id}",
    )
