"""`GET /v1/transforms/{id}/events`: a transform's progress as server-sent events (SSE).

One `progress` event with the transform (as `GET /v1/transforms/{id}` shows it) as it is now,
then one each time it changes (status, counts, shards, the records its running shards did), and
the stream ends after the event of its end (succeeded, failed, canceled). As a job's stream
(api/routes/events.py), one that has not ended closes after `STREAM_MAX_S` and its client
resumes with `Last-Event-ID`; one whose `Last-Event-ID` names its end gets 204.

An event's id is `<status>.<shards done>.<shards failed>.<records done>`. What wakes a stream:
the announcement of any of its shards' ends (`api.waiter`), and a re-read every
`PROGRESS_RECHECK_S` for what nobody announces (a shard started, a heartbeat's progress).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import SQLAlchemyError

from api.ids import JobId
from api.routes.events import EVENT_STREAM, KEEP_ALIVE_S, RETRY_MS, STREAM_MAX_S
from api.routes.transforms import read
from api.schemas import error_responses
from api.state import AppState, get_state
from db.models import TransformStatus
from db.tenants import Caller
from tffleet.errors import NotFound, ServiceUnavailable

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/transforms", tags=["transforms"])

# Progress nobody announces (a heartbeat's records done) is re-read this often.
PROGRESS_RECHECK_S = 1.0


def event_id(transform: dict[str, Any]) -> str:
    shards, counts = transform["shards"], transform["counts"]
    done = counts["succeeded"] + counts["failed"]
    records = round(transform["progress"] * counts["records"]) if counts["records"] else done
    return f"{transform['status']}.{shards['done']}.{shards['failed']}.{records}"


def format_event(transform: dict[str, Any]) -> bytes:
    data = orjson.dumps(transform)
    return b"event: progress\nid: " + event_id(transform).encode() + b"\ndata: " + data + b"\n\n"


def _ended(transform: dict[str, Any]) -> bool:
    return TransformStatus(transform["status"]).finished


@router.get(
    "/{transform_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`progress` events, each with the transform as GET returns it.",
            "content": {EVENT_STREAM: {"schema": {"type": "string"}}},
        },
        204: {"description": "`Last-Event-ID` names the transform's end: nothing to send."},
        **error_responses(404, 422, 503),
    },
)
async def transform_events(
    transform_id: JobId,
    request: Request,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", max_length=128, description="Resume after this event."),
    ] = None,
) -> Response:
    """The transform's progress as server-sent events, until it ends.

    An event `progress` per change, its data the transform; a `: keep-alive` comment every
    15 s. A `Last-Event-ID` naming its end is answered 204."""
    state = get_state(request)
    caller = await state.auth(request)
    if state.waiter.watches >= state.settings.max_long_polls:
        error = ServiceUnavailable("this API process holds as many waiting requests as it may")
        error.headers = {"Retry-After": "1"}
        raise error
    transform, shard_ids = await run_in_threadpool(read, state, caller, transform_id, True)
    last = (last_event_id or "").strip()
    if _ended(transform) and event_id(transform) == last:
        return Response(status_code=204)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    stream = _events(state, caller, transform, shard_ids, last)
    return StreamingResponse(stream, media_type=EVENT_STREAM, headers=headers)


async def _events(
    state: AppState, caller: Caller, transform: dict[str, Any], shard_ids: list[str], last: str
) -> AsyncIterator[bytes]:
    """The stream after the first read. Cancelled when the client goes away (the watch with it)."""
    loop = asyncio.get_running_loop()
    with state.waiter.watch(*shard_ids) as woken:
        yield f"retry: {RETRY_MS}\n\n".encode()
        quiet_since = loop.time()
        close_at = quiet_since + STREAM_MAX_S
        while True:
            if event_id(transform) != last:
                last = event_id(transform)
                yield format_event(transform)
                quiet_since = loop.time()
            if _ended(transform) or loop.time() >= close_at:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    woken.wait(), min(PROGRESS_RECHECK_S, close_at - loop.time())
                )
            woken.clear()
            if loop.time() - quiet_since >= KEEP_ALIVE_S:
                yield b": keep-alive\n\n"
                quiet_since = loop.time()
            try:
                transform, _ = await run_in_threadpool(read, state, caller, transform["id"])
            except NotFound:
                return
            except SQLAlchemyError as exc:  # the database is away: try again on the next timer
                log.warning(
                    "event stream of transform %s cannot read it (%s)", transform["id"], exc
                )
