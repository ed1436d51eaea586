"""TF Serving's REST API (predict, model status, model metadata) over the job queue.

A predict request is one job of the caller's tenant, stored, batched and run as any other, and
the answer waits for it (`TFFLEET_PROTOCOL_WAIT_S`); past that, 504 naming the job, which runs
on and is polled at `/v1/jobs/{id}`. The paths are TF Serving's own (`/v1/models/{name}...`):
tffleet has only `GET /v1/models` there, which stays its listing. Errors are TF Serving's
`{"error": "message"}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.body import INLINE_BYTES, read_json
from api.protocols import facade
from api.protocols.tfserving import codec
from api.schemas import json_response
from api.state import AppState, get_state
from db import clock, presence, registry
from tffleet.errors import (
    ModelNotFound,
    TffleetError,
)

router = APIRouter(tags=["tfserving"])

_RESPONSES = facade.responses(400, 401, 404, 409, 413, 429, 500, 503, 504)


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
        model, version = facade.model_ref(name, version_text)
        body = await read_json(
            request,
            max_bytes=state.settings.max_body_bytes,
            max_items=state.settings.max_json_items,
            any_type=True,
        )
        signature = state.signatures.cached(model, version)
        if signature is None:
            signature = await run_in_threadpool(state.signatures.resolve, model, version)
        parsed = codec.read_predict(
            body,
            input_names=sorted(signature["inputs"]),
            signature=signature["config"].get("signature", codec.DEFAULT_SIGNATURE),
        )
        declared = request.headers.get("content-length", "")
        answer = await facade.run_job(
            state, caller, model=model, version=version, inputs=parsed.inputs,
            inline=declared.isdigit() and int(declared) <= INLINE_BYTES,
        )  # fmt: skip
        return json_response(codec.predict_answer(answer.outputs, parsed.format))
    except TffleetError as exc:
        return facade.rejected(exc)


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
        model, version = facade.model_ref(name, version_text)

        def read() -> list[dict[str, Any]]:
            found = facade.versions(state, model)
            states = [
                codec.version_status(m.version, _state(m.retired_at is not None, loaded))
                for m, loaded in found
                if version is None or m.version == version
            ]
            if not states:
                raise ModelNotFound(f"version: model {model!r} has no version {version}")
            return states

        return json_response({"model_version_status": await run_in_threadpool(read)})
    except TffleetError as exc:
        return facade.rejected(exc)


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
        model, version = facade.model_ref(name, version_text)
        answer = await run_in_threadpool(_read_metadata, state, model, version)
        return json_response(answer)
    except TffleetError as exc:
        return facade.rejected(exc)


def _read_metadata(state: AppState, name: str, version: int | None) -> dict[str, Any]:
    with state.reads() as session:
        since = presence.live_since(state.settings.model_poll_s, clock.now(session))
        found = registry.resolve(session=session, name=name, version=version, live_since=since)
        return codec.metadata(
            name=found.name,
            version=found.version,
            signature=(found.config or {}).get("signature", codec.DEFAULT_SIGNATURE),
            inputs=found.inputs,
            outputs=found.outputs,
        )
