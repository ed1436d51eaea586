"""POST /v1/uploads: a tensor put in the object store once, for jobs to name by URI (DESIGN §13).

The body, an .npy, is streamed into the store as it arrives and never held whole: its header,
read from the first bytes, says the dtype and shape, and the bytes that follow must be exactly
as many as those make. Only then is the upload's row written; a body that is no .npy, or that
holds more or fewer bytes, leaves neither object nor row. An .npz (named arrays) is streamed in
whole the same way, then indexed by ranged reads of its zip directory and .npy headers
(api/npz_uploads.py); a malformed one is deleted again and leaves no row. With `?presign=true`
and no body, the answer holds a URL to PUT the .npy to (an S3 store only), checked when a job
first names it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from api import npz_uploads, writeahead
from api.body import by_reference_problem, npy_stream
from api.negotiation import media_type
from api.schemas import UploadOut, error_responses, json_response
from api.state import AppState, get_state
from db import clock, objects
from db.tenants import Caller
from tffleet import tensors
from tffleet.errors import InvalidInput, UnsupportedMediaType
from tffleet.objectstore import keys

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/uploads", tags=["uploads"])

_NPY_BODY = {
    "requestBody": {
        "required": False,
        "content": {
            tensors.NPY: {
                "schema": {"type": "string", "format": "binary"},
                "example": "(what np.save writes)",
            },
            tensors.NPZ: {
                "schema": {"type": "string", "format": "binary"},
                "example": "(what np.savez writes)",
            },
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=UploadOut,
    responses=error_responses(400, 413, 415, 422, 503),
    openapi_extra=_NPY_BODY,
)
async def upload(
    request: Request,
    presign: Annotated[
        bool, Query(description="No body: answer a URL to PUT the .npy to (an S3 store).")
    ] = False,
) -> Response:
    """Store a tensor (`Content-Type: application/x-npy`, what `np.save` writes: a number or
    bool dtype) for jobs to name as an input: `{"uri": "tffleet://uploads/<id>"}` wherever a
    tensor goes. Or named arrays (`application/x-npz`, what `np.savez` writes, uncompressed):
    the answer's `members` lists them, and a job names one as `tffleet://uploads/<id>/<name>`,
    or by the upload's URI for an input of that name. The body is streamed into the object
    store, never held whole; 413 past TFFLEET_MAX_UPLOAD_BYTES, 422 for a body that is no .npy
    (or .npz: compressed, malformed) or holds more or fewer bytes than its header says. Kept
    TFFLEET_UPLOAD_TTL_S, and while a job naming it keeps its inputs.

    `?presign=true` with no body: the answer's `upload_url` takes the .npy by PUT, straight to
    the store (S3 only); its header is checked when a job first names it."""
    state = get_state(request)
    caller = await state.auth(request)
    upload_id = keys.new_upload_id()
    key = keys.upload_key(caller.tenant, upload_id)
    if presign:
        return await _presigned(state, request, caller, upload_id, key)
    media = media_type(request.headers.get("content-type", ""))
    if media == tensors.NPZ:
        return await _npz(state, request, caller, upload_id)
    if media != tensors.NPY:
        raise UnsupportedMediaType(
            f"Content-Type must be {tensors.NPY} (what np.save writes) or {tensors.NPZ} (np.savez)"
        )
    header, chunks = await npy_stream(request, max_bytes=state.settings.max_upload_bytes)
    problem = by_reference_problem(header)  # stored as it came: a worker reads it as it lies
    if problem is not None:
        raise InvalidInput(f"body: {problem}")
    await writeahead.write_ahead(state, [key])  # garbage unless its row is committed in time
    try:
        size = await state.objects.put_stream_async(key, chunks)
        expires_at = await run_in_threadpool(
            _record, state, caller, upload_id, size, header.dtype.name, list(header.shape)
        )
    except BaseException:
        # No row names the object: it goes now (or, the store down too, once its garbage is due).
        await writeahead.discard(state, [key])
        raise
    return _answer(upload_id, None, expires_at, header.dtype.name, list(header.shape), size)


async def _npz(state: AppState, request: Request, caller: Caller, upload_id: str) -> Response:
    """An .npz body streamed into the store whole, then its members found by ranged reads and
    recorded; an .npz that is no fit (malformed, compressed, an array that cannot go by
    reference) is deleted again, leaving no row."""
    key = keys.upload_key(caller.tenant, upload_id, "npz")
    chunks = await npz_uploads.npz_stream(request, max_bytes=state.settings.max_upload_bytes)
    await writeahead.write_ahead(state, [key])
    try:
        size = await state.objects.put_stream_async(key, chunks)
        found = await run_in_threadpool(npz_uploads.index, state.objects, key, size)
        members = {name: member.as_json() for name, member in found.items()}
        expires_at = await run_in_threadpool(
            _record, state, caller, upload_id, size, None, None, members
        )
    except BaseException:
        await writeahead.discard(state, [key])
        raise
    return _answer(upload_id, None, expires_at, None, None, size, members)


async def _presigned(
    state: AppState, request: Request, caller: Caller, upload_id: str, key: str
) -> Response:
    if not state.objects.presigns:
        raise InvalidInput(
            f"presign: needs an S3 object store (TFFLEET_OBJECT_STORE=s3://...); this fleet's "
            f"is {state.objects.url}: send the .npy as the body instead"
        )
    async for chunk in request.stream():
        if chunk:
            raise InvalidInput("body: must be empty with presign=true (PUT the .npy to upload_url)")
    ttl_s = state.settings.upload_ttl_s
    url = state.objects.presign_put(key, ttl_s)
    expires_at = await run_in_threadpool(_record, state, caller, upload_id, None, None, None)
    return _answer(upload_id, url, expires_at, None, None, None)


def _record(
    state: AppState,
    caller: Caller,
    upload_id: str,
    size: int | None,
    dtype: str | None,
    shape: list[int] | None,
    members: dict[str, dict[str, object]] | None = None,
) -> datetime:
    with state.sessions.begin() as session:
        expires_at = clock.now(session) + timedelta(seconds=state.settings.upload_ttl_s)
        objects.create_upload(
            session=session,
            upload_id=upload_id,
            tenant=caller.tenant,
            expires_at=expires_at,
            size=size,
            dtype=dtype,
            shape=shape,
            written_ahead=size is not None,  # a body the API stored; a presigned PUT is to come
            members=members,
        )
    return expires_at


def _answer(
    upload_id: str,
    url: str | None,
    expires_at: datetime,
    dtype: str | None,
    shape: list[int] | None,
    size: int | None,
    members: dict[str, dict[str, Any]] | None = None,
) -> Response:
    """The 201: an .npz's `members` by name, each its dtype and shape (where its data lies in
    the object is the database's business)."""
    body: dict[str, Any] = {
        "uri": keys.upload_uri(upload_id),
        "upload_url": url,
        "expires_at": expires_at.isoformat(),
        "dtype": dtype,
        "shape": shape,
        "size": size,
        "members": None
        if members is None
        else {name: {"dtype": m["dtype"], "shape": m["shape"]} for name, m in members.items()},
    }
    return json_response(body, 201)
