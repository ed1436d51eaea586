"""The Open Inference Protocol (KServe's v2, Triton's HTTP/REST API) over the job queue: health,
server and model metadata, model readiness and configuration, and infer, with JSON tensors or
the binary tensor data extension (what `tritonclient.http` sends and asks for by default).

An infer request is one job of the caller's tenant, stored, batched and run as any other; the
answer waits for it (`TFFLEET_PROTOCOL_WAIT_S`, or the request's `timeout` parameter where it
is shorter: the job is then canceled at that deadline), past that 504 naming the job, which
stays pollable at `/v1/jobs/{id}`. Errors are the protocol's `{"error": "message"}`.

The health routes and the server's metadata answer without a key, as /healthz does; everything
about a model takes one, as the job API does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

import tffleet
from api.body import INLINE_BYTES, read_bytes
from api.protocols import facade
from api.protocols.oip import codec, metadata
from api.routes.health import readiness
from api.schemas import json_response
from api.state import get_state
from db import clock, presence, registry
from tffleet.errors import ModelNotFound, TffleetError, UnsupportedMediaType

router = APIRouter(prefix="/v2", tags=["open inference protocol"])

_MODEL = facade.responses(400, 401, 404, 503)
_INFER = facade.responses(400, 401, 404, 409, 413, 429, 500, 503, 504)


@router.get("/health/live")
async def live() -> Response:
    """The server is up: 200."""
    return json_response({"live": True})


@router.get("/health/ready", responses={400: {"description": "Not ready; `error` says why."}})
async def ready(request: Request) -> Response:
    """The database and the broker answer: 200; otherwise 400, as the protocol has it (a 4xx
    is "false")."""
    checks = await run_in_threadpool(readiness, get_state(request))
    down = {name: how for name, how in checks.items() if how != "ok"}
    if down:
        why = "; ".join(f"{name} {how}" for name, how in down.items())
        return json_response({"ready": False, "error": why}, 400)
    return json_response({"ready": True})


@router.get("")
async def server_metadata() -> Response:
    """The server's name, version and protocol extensions."""
    return json_response(
        {"name": "tffleet", "version": tffleet.__version__, "extensions": metadata.EXTENSIONS}
    )


@router.get("/models/{name}/ready", responses=_MODEL)
async def model_ready(name: str, request: Request) -> Response:
    """200 while a live worker holds the model's latest version; 400 until then (404 for a
    model that is not registered)."""
    return await _ready(request, name, None)


@router.get("/models/{name}/versions/{version}/ready", responses=_MODEL)
async def model_version_ready(name: str, version: str, request: Request) -> Response:
    """200 while a live worker holds this version and it takes new jobs (not retired)."""
    return await _ready(request, name, version)


async def _ready(request: Request, name: str, version_text: str | None) -> Response:
    state = get_state(request)
    try:
        await state.auth(request)
        model, version = facade.model_ref(name, version_text)

        def read() -> bool:
            found = facade.versions(state, model)
            served = [m.version for m, loaded in found if loaded and m.retired_at is None]
            if version is None:
                return bool(served)
            if not any(m.version == version for m, _ in found):
                raise ModelNotFound(f"version: model {model!r} has no version {version}")
            return version in served

        ready = await run_in_threadpool(read)
        return json_response({"name": model, "ready": ready}, 200 if ready else 400)
    except TffleetError as exc:
        return facade.rejected(exc)


@router.get("/models/{name}", responses=_MODEL)
async def model_metadata(name: str, request: Request) -> Response:
    """The model's versions (those taking new jobs), platform, and its latest version's inputs
    and outputs: datatype and shape, -1 where a dimension is free (the batch first)."""
    return await _described(request, name, None, config=False)


@router.get("/models/{name}/versions/{version}", responses=_MODEL)
async def model_version_metadata(name: str, version: str, request: Request) -> Response:
    """One version's metadata."""
    return await _described(request, name, version, config=False)


@router.get("/models/{name}/config", responses=_MODEL)
async def model_config(name: str, request: Request) -> Response:
    """Triton's model configuration (`get_model_config`): platform, max_batch_size, and the
    inputs and outputs with `dims` leaving out the batch dimension."""
    return await _described(request, name, None, config=True)


@router.get("/models/{name}/versions/{version}/config", responses=_MODEL)
async def model_version_config(name: str, version: str, request: Request) -> Response:
    """One version's model configuration."""
    return await _described(request, name, version, config=True)


async def _described(
    request: Request, name: str, version_text: str | None, *, config: bool
) -> Response:
    state = get_state(request)
    try:
        await state.auth(request)
        model, version = facade.model_ref(name, version_text)

        def read() -> dict[str, Any]:
            with state.reads() as session:
                since = presence.live_since(state.settings.model_poll_s, clock.now(session))
                found = registry.resolve(
                    session=session, name=model, version=version, live_since=since
                )
                versions = registry.versions_of(session=session, name=model, live_since=since)
            if config:
                return metadata.model_config(
                    name=found.name,
                    format=found.format,
                    max_batch_size=int(
                        (found.config or {}).get("max_batch_size", state.settings.max_batch_size)
                    ),
                    inputs=found.inputs,
                    outputs=found.outputs,
                )
            return metadata.model_metadata(
                name=found.name,
                versions=[m.version for m, _ in versions if m.retired_at is None],
                format=found.format,
                inputs=found.inputs,
                outputs=found.outputs,
            )

        return json_response(await run_in_threadpool(read))
    except TffleetError as exc:
        return facade.rejected(exc)


@router.post("/repository/index", responses=facade.responses(400, 401, 503))
async def repository_index(request: Request) -> Response:
    """Triton's model repository index (`get_model_repository_index`): every registered version,
    `READY` while a live worker holds it and it takes new jobs, else `UNAVAILABLE` with the
    reason. With `{"ready": true}`, the ready ones only. (Loading and unloading are the
    workers' own: new version directories are served as they appear.)"""
    state = get_state(request)
    try:
        await state.auth(request)
        body = await read_bytes(request, max_bytes=state.settings.max_body_bytes)
        ready_only = metadata.read_index_request(body)

        def read() -> list[dict[str, Any]]:
            with state.reads() as session:
                since = presence.live_since(state.settings.model_poll_s, clock.now(session))
                found = registry.overview(session=session, live_since=since)
            index = [
                metadata.index_entry(
                    v.model.name, v.model.version, served=v.served, retired=v.retired
                )
                for v in found.versions
            ]
            return [e for e in index if e["state"] == "READY"] if ready_only else index

        return json_response(await run_in_threadpool(read))
    except TffleetError as exc:
        return facade.rejected(exc)


@router.post("/models/{name}/infer", responses=_INFER)
async def infer(name: str, request: Request) -> Response:
    """Infer on the model's latest version: a JSON body, or with the binary tensor data
    extension a JSON header (its length in `Inference-Header-Content-Length`) followed by the
    inputs' bytes. Outputs as asked (`binary_data`, `binary_data_output`), all by default. One
    job of the caller's tenant, waited for up to TFFLEET_PROTOCOL_WAIT_S."""
    return await _infer(request, name, None)


@router.post("/models/{name}/versions/{version}/infer", responses=_INFER)
async def infer_version(name: str, version: str, request: Request) -> Response:
    """Infer on the given version."""
    return await _infer(request, name, version)


async def _infer(request: Request, name: str, version_text: str | None) -> Response:
    state = get_state(request)
    settings = state.settings
    try:
        caller = await state.auth(request)  # before the body, as the job API
        model, version = facade.model_ref(name, version_text)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise UnsupportedMediaType(
                f"Content-Encoding: {encoding!r} is not accepted; send the body uncompressed"
            )
        body = await read_bytes(request, max_bytes=settings.max_body_bytes)
        header, binary = codec.split_body(body, request.headers.get(codec.HEADER_LENGTH))
        parsed_json = codec.read_header(header, max_items=settings.max_json_items)
        signature = state.signatures.cached(model, version)
        if signature is None:
            signature = await run_in_threadpool(state.signatures.resolve, model, version)

        def read() -> codec.InferRequest:
            return codec.read_infer(
                parsed_json,
                binary,
                model=model,
                inputs=signature["inputs"],
                outputs=signature["outputs"],
            )

        small = len(body) <= INLINE_BYTES
        parsed = read() if small else await run_in_threadpool(read)
        wait_s = settings.protocol_wait_s
        if parsed.timeout_s is not None:
            wait_s = min(wait_s, parsed.timeout_s)
        answer = await facade.run_job(
            state,
            caller,
            model=model,
            version=version,
            inputs=parsed.inputs,
            cancel_after_s=parsed.timeout_s,
            wait_s=wait_s,
            inline=small,
            shapes=parsed.shapes,
        )
        head, data = codec.infer_answer(
            model=answer.model,
            version=answer.version,
            request=parsed,
            outputs=answer.outputs,
            job_id=answer.job_id,
        )
    except TffleetError as exc:
        return facade.rejected(exc)
    if not data:
        return Response(head, media_type="application/json")
    return Response(
        b"".join([head, *data]),
        media_type="application/octet-stream",
        headers={codec.HEADER_LENGTH: str(len(head))},
    )
