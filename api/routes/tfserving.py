"""TF Serving's REST API (predict, model status, model metadata) over the job queue.

A predict request is one job of the caller's tenant, stored, batched and run as any other, and
the answer waits for it (`TFFLEET_PROTOCOL_WAIT_S`); past that, 504 naming the job, which runs
on and is polled at `/v1/jobs/{id}`. The paths are TF Serving's own (`/v1/models/{name}...`):
tffleet has only `GET /v1/models` there, which stays its listing. Errors are TF Serving's
`{"error": "message"}`.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import SQLAlchemyError

from api import tfserving
from api.body import read_json
from api.ingest import BLOB
from api.metrics import REQUESTS_REJECTED
from api.routes.jobs import _parse, _prepare, _wait_for
from api.schemas import JobCreate, json_response
from api.state import AppState, get_state
from db import clock, presence, registry
from db.models import JobStatus
from tffleet import tensors
from tffleet.errors import (
    InvalidInput,
    InvalidRequest,
    ModelNotFound,
    ServiceUnavailable,
    TffleetError,
)

router = APIRouter(tags=["tfserving"])

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_MAX_VERSION = 2**31 - 1

_ERROR = {"content": {"application/json": {"example": {"error": "message"}}}}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, **_ERROR}
    for status, text in (
        (400, "A malformed request, or inputs that do not fit the model's signature."),
        (401, "No API key, or an unknown or revoked one."),
        (404, "Unknown model or version."),
        (413, "Body over the size limit."),
        (429, "The queue, or the tenant's quota, is full."),
        (503, "Database or broker unreachable."),
        (504, "The job has not ended within TFFLEET_PROTOCOL_WAIT_S; the message names it."),
    )
}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    response = json_response({"error": message}, status)
    response.headers.update(headers or {})
    return response


def _from(exc: TffleetError) -> Response:
    REQUESTS_REJECTED.labels(code=exc.code).inc()
    # TF Serving answers inputs that do not fit (INVALID_ARGUMENT) with 400, not tffleet's 422.
    status = 400 if isinstance(exc, InvalidInput) else exc.status_code
    return _error(status, exc.message, exc.headers)


def _model(name: str, version: str | None) -> tuple[str, int | None]:
    if not _NAME.match(name):
        raise ModelNotFound(f"model: no model named {name!r} is registered")
    if version is None:
        return name, None
    if not version.isascii() or not version.isdigit() or not 1 <= int(version) <= _MAX_VERSION:
        raise InvalidRequest(f"version: expected a positive integer, got {version!r}")
    return name, int(version)


@router.post("/v1/models/{name}:predict", responses=_RESPONSES)
async def predict(name: str, request: Request) -> Response:
    """TF Serving's predict, the model's latest version: `{"instances": [...]}` (row format)
    answered `{"predictions": ...}`, or `{"inputs": ...}` (columnar) answered `{"outputs":
    ...}`. One job of the caller's tenant, waited for up to TFFLEET_PROTOCOL_WAIT_S."""
    return await _predict(request, name, None)


@router.post("/v1/models/{name}/versions/{version}:predict", responses=_RESPONSES)
async def predict_version(name: str, version: str, request: Request) -> Response:
    """TF Serving's predict on the given version."""
    return await _predict(request, name, version)


async def _predict(request: Request, name: str, version_text: str | None) -> Response:
    state = get_state(request)
    try:
        caller = await state.auth(request)  # before the body, as the job API
        model, version = _model(name, version_text)
        body = await read_json(
            request,
            max_bytes=state.settings.max_body_bytes,
            max_items=state.settings.max_json_items,
            any_type=True,
        )
        signature = state.signatures.cached(model, version)
        if signature is None:
            signature = await run_in_threadpool(state.signatures.resolve, model, version)
        parsed = tfserving.read_predict(
            body,
            input_names=sorted(signature["inputs"]),
            signature=signature["config"].get("signature", tfserving.DEFAULT_SIGNATURE),
        )
        spec = _parse(JobCreate, {"model": model, "version": version, "inputs": parsed.inputs})
        # Checked before anything is stored, as POST /v1/jobs does: a bad request stores nothing.
        limits = await state.admission.limits(caller.tenant)
        new = await run_in_threadpool(_prepare, state, [spec], False, caller, limits)
        await state.admission.admit(len(new), tenant=caller.tenant, limits=limits)
        ingested = await state.ingestor(new)
        job_id = ingested.jobs[0]["id"]
        wait_s = state.settings.protocol_wait_s
        try:
            (out,) = await _wait_for(
                state, caller, [job_id], wait_s=wait_s, encoding=BLOB, until="all",
                known=ingested.jobs,
            )  # fmt: skip
        except SQLAlchemyError:
            raise ServiceUnavailable(
                f"job {job_id} is stored, but the database failed while waiting for it; "
                f"poll GET /v1/jobs/{job_id}"
            ) from None
        return _ended(out, parsed.format, wait_s)
    except TffleetError as exc:
        return _from(exc)


def _ended(out: dict[str, Any], format: tfserving.Format, wait_s: float) -> Response:
    job_id, status = out["id"], out["status"]
    if status == JobStatus.SUCCEEDED.value:
        outputs = tensors.unpack(out["outputs"])
        return json_response(tfserving.predict_answer(outputs, format))
    error = out.get("error") or {"code": "unknown", "message": ""}
    code, message = error["code"], error["message"]
    REQUESTS_REJECTED.labels(code=f"job_{status}").inc()
    if status == JobStatus.FAILED.value:
        http = 400 if code == "invalid_input" else 504 if code in ("timeout", "deadline") else 500
        return _error(http, f"job {job_id} failed ({code}): {message}")
    if status == JobStatus.CANCELED.value:
        return _error(409, f"job {job_id} was canceled ({code}): {message}")
    return _error(
        504,
        f"job {job_id} has not ended within {wait_s:g} s (it is {status}); it goes on: "
        f"poll GET /v1/jobs/{job_id}",
    )


@router.get("/v1/models/{name}", responses=_RESPONSES)
async def model_status(name: str, request: Request) -> Response:
    """TF Serving's model status: each registered version, `AVAILABLE` while a live worker
    holds it, `START` until one does, `END` once retired."""
    return await _status(request, name, None)


@router.get("/v1/models/{name}/versions/{version}", responses=_RESPONSES)
async def model_version_status(name: str, version: str, request: Request) -> Response:
    """TF Serving's model status of one version."""
    return await _status(request, name, version)


async def _status(request: Request, name: str, version_text: str | None) -> Response:
    state = get_state(request)
    try:
        await state.auth(request)
        model, version = _model(name, version_text)

        def read() -> list[dict[str, Any]]:
            with state.reads() as session:
                since = presence.live_since(state.settings.model_poll_s, clock.now(session))
                found = registry.versions_of(session=session, name=model, live_since=since)
            if not found:
                raise ModelNotFound(f"model: no model named {model!r} is registered")
            states = [
                tfserving.version_status(m.version, _state(m.retired_at is not None, loaded))
                for m, loaded in found
                if version is None or m.version == version
            ]
            if not states:
                raise ModelNotFound(f"version: model {model!r} has no version {version}")
            return states

        return json_response({"model_version_status": await run_in_threadpool(read)})
    except TffleetError as exc:
        return _from(exc)


def _state(retired: bool, loaded: bool) -> str:
    return "END" if retired else "AVAILABLE" if loaded else "START"


@router.get("/v1/models/{name}/metadata", responses=_RESPONSES)
async def model_metadata(name: str, request: Request) -> Response:
    """TF Serving's model metadata of the latest version: its signature as registered."""
    return await _metadata(request, name, None)


@router.get("/v1/models/{name}/versions/{version}/metadata", responses=_RESPONSES)
async def model_version_metadata(name: str, version: str, request: Request) -> Response:
    """TF Serving's model metadata of one version."""
    return await _metadata(request, name, version)


async def _metadata(request: Request, name: str, version_text: str | None) -> Response:
    state = get_state(request)
    try:
        await state.auth(request)
        model, version = _model(name, version_text)
        answer = await run_in_threadpool(_read_metadata, state, model, version)
        return json_response(answer)
    except TffleetError as exc:
        return _from(exc)


def _read_metadata(state: AppState, name: str, version: int | None) -> dict[str, Any]:
    with state.reads() as session:
        since = presence.live_since(state.settings.model_poll_s, clock.now(session))
        found = registry.resolve(session=session, name=name, version=version, live_since=since)
        return tfserving.metadata(
            name=found.name,
            version=found.version,
            signature=(found.config or {}).get("signature", tfserving.DEFAULT_SIGNATURE),
            inputs=found.inputs,
            outputs=found.outputs,
        )
