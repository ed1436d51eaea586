"""`GET /v1/jobs/{id}/events`: a job's changes of status as server-sent events (SSE).

One `status` event with the job (as `GET /v1/jobs/{id}` shows it) as it is now, then one at each
change of its status, and the stream ends after the event of an ended status (succeeded, failed,
canceled), outputs included. A stream of a job that has not ended also closes after
`STREAM_MAX_S` (30 s, a long-poll's longest hold): its client resumes with `Last-Event-ID`, as
after a dropped connection.

An event's id is `<status>.<attempts>` (`queued.0`, `running.1`, `queued.1` after a lease was
lost, `running.2`, `succeeded.2`), and ids order the states of a run of the job, from queued to
its end: queued with n attempts behind it comes after running attempt n, running attempt n after
queued with n - 1, an ended status with n attempts after both. A client that reconnects with
`Last-Event-ID` is sent only states later than that one. An ended status closes the run: a
client that saw it gets 204 (which tells a browser's EventSource to stop reconnecting), unless
the job was retried since (`POST /v1/jobs/{id}/retry`), which starts a new run, sent from its
current state.

What wakes a stream: the completion announcements the long-poll waits on (`api.waiter`), for
the end. Nothing announces that a worker claimed a job, so while the job is queued the stream
re-reads it every `QUEUED_RECHECK_S` to see it start; while it runs, every `waiter.recheck_s`, as
a long-poll does, so that an announcement lost with Redis (or a lease lost and the job queued
again, which nobody announces) is seen late, never missed. The reads go through the coalesced
`JobReader`: many streams, one query. A stream holds one watch of the waiter (counted with the
long-polls) and no thread; a client that goes away cancels it, which drops the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import SQLAlchemyError

from api.ids import JobId
from api.ingest import Read, job_view
from api.schemas import error_responses
from api.state import AppState, get_state
from db.models import FINISHED, JobStatus
from db.tenants import Caller
from tffleet.errors import JobNotFound, ServiceUnavailable

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

EVENT_STREAM = "text/event-stream"
# A comment line this often while nothing else is sent, so that proxies keep the connection.
KEEP_ALIVE_S = 15.0
# No announcement says that a job started: a queued job is re-read this often (one coalesced
# read per stream). The end of a job comes from its announcement, within milliseconds.
QUEUED_RECHECK_S = 1.0
# How long an EventSource waits before it reconnects (the `retry:` field).
RETRY_MS = 2000
# A stream of a job that has not ended closes after this long, and its client resumes with
# `Last-Event-ID`: a stream is held no longer than a long-poll, so an API process told to stop
# (uvicorn waits for open responses) is not held up by streams of jobs queued for hours.
STREAM_MAX_S = 30.0

_FINISHED = {status.value for status in FINISHED}
_STATUSES = {status.value for status in JobStatus}


def event_id(job: dict[str, Any]) -> str:
    return f"{job['status']}.{job['attempts']}"


def rank(event_id: str | None) -> int:
    """Where a state comes in a run of a job; -1 for no id (or one this API never sends)."""
    status, _, attempts = (event_id or "").strip().partition(".")
    if status not in _STATUSES or not attempts.isdigit() or len(attempts) > 9:
        return -1
    n = int(attempts)
    if status in _FINISHED:
        return 4 * n + 1
    # queued.0 < running.1 < queued.1 < running.2 < ..., and an end after the state it ended
    return 4 * n if status == JobStatus.QUEUED.value else 4 * n - 2


def _resumed_after(last_event_id: str | None, job: dict[str, Any]) -> int | None:
    """The rank the client has seen, or None where it has seen the job as it is, ended."""
    seen = rank(last_event_id)
    if seen % 4 != 1:  # not an end (nor junk, ranked -1)
        return seen
    if event_id(job) == (last_event_id or "").strip():
        return None
    return -1  # the end of an earlier run: the job was retried since


def format_event(job: dict[str, Any]) -> bytes:
    data = orjson.dumps(job, option=orjson.OPT_SERIALIZE_NUMPY)  # one line: JSON escapes \n
    return b"event: status\nid: " + event_id(job).encode() + b"\ndata: " + data + b"\n\n"


_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "`status` events, each with the job as `GET /v1/jobs/{id}` returns it.",
        "content": {EVENT_STREAM: {"schema": {"type": "string"}}},
    },
    204: {"description": "`Last-Event-ID` names the end of the job: nothing more to send."},
}


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={**_STREAM_RESPONSES, **error_responses(404, 422, 503)},
)
async def job_events(
    job_id: JobId,
    request: Request,
    encoding: Annotated[Literal["json", "b64"], Query(description="`b64`: binary outputs.")] = (
        "json"
    ),
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", max_length=64, description="Resume after this event."),
    ] = None,
) -> Response:
    """The job's changes of status as server-sent events, until it ends.

    An event `status` per change, its data the job; ids `<status>.<attempts>` order the job's
    states, and `Last-Event-ID` resumes after one. A `: keep-alive` comment every 15 s.
    """
    state = get_state(request)
    caller = await state.auth(request)
    if state.waiter.watches >= state.settings.max_long_polls:
        raise _busy()
    job = await _read(state, caller, job_id, encoding)  # 404 before anything is streamed
    seen = _resumed_after(last_event_id, job)
    if seen is None:
        return Response(status_code=204)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # nginx: do not buffer
    stream = _events(state, caller, job, encoding=encoding, seen=seen)
    return StreamingResponse(stream, media_type=EVENT_STREAM, headers=headers)


def _busy() -> ServiceUnavailable:
    error = ServiceUnavailable("this API process holds as many waiting requests as it may")
    error.headers = {"Retry-After": "1"}
    return error


async def _read(state: AppState, caller: Caller, job_id: str, encoding: str) -> dict[str, Any]:
    (job,) = await state.reader(Read([job_id], encoding, caller.scope))
    return _shown(caller, job)


def _shown(caller: Caller, job: dict[str, Any]) -> dict[str, Any]:
    """As `GET /v1/jobs/{id}` shows it: which worker ran a job is for admins."""
    if not caller.admin:
        job["worker"] = None
    return job


async def _events(
    state: AppState, caller: Caller, job: dict[str, Any], *, encoding: str, seen: int
) -> AsyncIterator[bytes]:
    """The stream after the first read (`job`). Cancelled when the client goes away: the watch
    is dropped on the way out."""
    job_id = job["id"]
    loop = asyncio.get_running_loop()
    # An announcement between the first read and this watch is remembered by the waiter, which
    # then wakes the watch at once.
    with state.waiter.watch(job_id) as woken:
        yield f"retry: {RETRY_MS}\n\n".encode()
        quiet_since = loop.time()
        close_at = quiet_since + STREAM_MAX_S
        while True:
            if rank(event_id(job)) > seen:
                seen = rank(event_id(job))
                yield format_event(job)
                quiet_since = loop.time()
            if job["status"] in _FINISHED or loop.time() >= close_at:
                return
            queued = job["status"] == JobStatus.QUEUED.value
            recheck_s = QUEUED_RECHECK_S if queued else state.waiter.recheck_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(recheck_s, close_at - loop.time()))
            woken.clear()
            if loop.time() - quiet_since >= KEEP_ALIVE_S:
                yield b": keep-alive\n\n"
                quiet_since = loop.time()
            announced = state.waiter.ended(job_id)
            if announced is not None:  # announced whole, signed: no read needed
                job = _shown(caller, job_view(announced, encoding))
                continue
            try:
                job = await _read(state, caller, job_id, encoding)
            except JobNotFound:  # deleted, or purged past its retention: nothing more to say
                return
            except SQLAlchemyError as exc:  # the database is away: try again on the next timer
                log.warning("event stream of job %s cannot read it (%s)", job_id, exc)
