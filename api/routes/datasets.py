"""PUT /v1/datasets/{path}: a file put in the fleet's own store for transforms to read (DESIGN §14).

A transform reads files the fleet allows (`tffleet.datasets.locations`): an operator's
TFFLEET_TRANSFORM_LOCATIONS, or the fleet's own store under the caller's tenant, named
`tffleet://datasets/<path>` (key `<tenant>/datasets/<path>`). On a fleet with no allowed
locations (`tffleet up`, say) the second is the only way in, and a user has no other access to
that store: this route is it. The body (any bytes: a Parquet, CSV, TFRecord file) is streamed
into the store as it arrives, never held whole; its format is the transform's business, checked
when a transform names it.

No row names a dataset: the object is the record. It is still written ahead as garbage first
(api/writeahead.py), and that garbage row is claimed once the object is whole, so an API that
dies mid-write leaves nothing the sweeper would not delete. A path that holds a file already
answers 409 unless `?overwrite=true`; a write that fails leaves the file that was there (the
store replaces an object only once the new one is whole), and deletes only what it wrote.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from api import writeahead
from api.schemas import error_responses, json_response
from api.state import AppState, get_state
from db import objects
from tffleet.datasets.locations import LocationRefused, resolve
from tffleet.errors import Conflict, InvalidInput, PayloadTooLarge

router = APIRouter(prefix="/v1/datasets", tags=["transforms"])

_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "example": "(the file's bytes: Parquet, TFRecord, CSV, JSON Lines or .npy)",
            }
        },
    }
}
_ANSWER: dict[str, Any] = {
    "description": "The dataset file as stored: its URI for a transform's input, and its size.",
    "content": {
        "application/json": {
            "example": {"uri": "tffleet://datasets/iris/train.csv", "size": 4551, "replaced": False}
        }
    },
}


@router.put(
    "/{path:path}",
    status_code=201,
    # 404: a path the router cannot match (Starlette's `path` convertor stops at a line break).
    responses={**error_responses(404, 409, 413, 422, 503), 201: _ANSWER, 200: _ANSWER},
    openapi_extra=_BODY,
)
async def put_dataset(
    request: Request,
    path: Annotated[
        str, Path(max_length=1000, description="Where under the tenant's datasets/ (a/b.csv).")
    ],
    overwrite: Annotated[
        bool, Query(description="Replace a file already at this path (else 409).")
    ] = False,
) -> Response:
    """Store a file in the fleet's object store for transforms to read as
    `tffleet://datasets/<path>` (the caller's tenant's own). The body is the file's bytes,
    streamed in, never held whole: 201 `{"uri", "size"}` (200 with `?overwrite=true` where a
    file was replaced). 409 where a file is at the path already, 413 past
    TFFLEET_MAX_UPLOAD_BYTES, 422 naming `path` for one with an empty, `.` or `..` part, a
    part ending with `:` or `|`, or a trailing `/`; a failed write leaves no file, or the one
    that was there."""
    state = get_state(request)
    caller = await state.auth(request)
    uri, key = _where(state, caller.tenant, path)
    existed = await state.objects.size_async(key) is not None
    if existed and not overwrite:
        raise Conflict(f"path: {uri} holds a file already; PUT with ?overwrite=true to replace it")
    chunks = _bounded(request, _declared_within(request, state.settings.max_upload_bytes))
    await writeahead.write_ahead(state, [key])  # garbage unless claimed once it is whole
    try:
        size = await state.objects.put_stream_async(key, chunks)
        await run_in_threadpool(_keep, state, key)
    except BaseException:
        if existed:  # the store left the file that was there: only the garbage row goes
            await run_in_threadpool(_forget, state, key)
        else:
            await writeahead.discard(state, [key])
        raise
    body = {"uri": uri, "size": size, "replaced": existed}
    return json_response(body, 200 if existed else 201)


def _where(state: AppState, tenant: str, path: str) -> tuple[str, str]:
    """The dataset's URI and its key in the fleet's store; 422 naming `path` where the
    locations a transform may name refuse it (a file's path: no trailing `/`)."""
    uri = f"tffleet://datasets/{path}"
    if not path or path.endswith("/"):
        raise InvalidInput(f"path: {path!r} names a folder, not a file (datasets/a/b.csv)")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise InvalidInput(f"path: {path!r} holds a control character, which no key may")
    try:
        location = resolve(uri, tenant, state.settings, write=True)
    except LocationRefused as exc:
        raise InvalidInput(f"path: {exc}") from None
    return uri, location.key


def _declared_within(request: Request, max_bytes: int) -> int:
    """`max_bytes`, once the body's Content-Length (where it has one) is within it: 413 before
    anything is written."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    return max_bytes


async def _bounded(request: Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The body's chunks, 413 where they pass `max_bytes` (the writer then keeps nothing)."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
        if chunk:
            yield chunk


def _keep(state: AppState, key: str) -> None:
    """The dataset is whole: its written-ahead garbage row goes (503 where it is nearly due,
    the sweeper then maybe deleting it: the caller sends it again)."""
    with state.sessions.begin() as session:
        objects.claim_in_time(session=session, keys=[key])


def _forget(state: AppState, key: str) -> None:
    with state.sessions.begin() as session:
        objects.claim(session=session, keys=[key])
