"""The two requests a web app sends most, `POST /v1/jobs` and `GET /v1/jobs/{id}`, straight to
their route functions, past FastAPI's router and request wrappers.

FastAPI tries a request against every route included before the one it is for, then wraps the
call in its exception and exit-stack layers and checks the query parameters with pydantic:
140 to 180 us of CPU per request for these two, an eighth of a one-job submission's and a quarter
of a poll's (`bench/hotpath.py` prints both ways). Here a request of theirs goes to the
same function (`api.routes.jobs.submit`, `get_job`) and its errors through the app's own
exception handlers, as the router would send them.

Only a request that FastAPI would hand to the function as it is takes this way: its path
exactly, and no query parameter but `wait` (a plain decimal from 0 to 30) and `encoding`
(`json` or `b64`), each at most once. Any other (a parameter FastAPI refuses, one the function
reads itself, such as a binary body's `model`) goes the usual way, so every answer is the
route's, error messages included. The routes stay declared in FastAPI, so the OpenAPI document
describes them as before.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.ids import JOB_ID_MAX_LENGTH
from api.routes import jobs

Call = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, Exception], Awaitable[Response]]

_JOB_PATH = re.compile(rf"/v1/jobs/([^/\x00]{{1,{JOB_ID_MAX_LENGTH}}})")
# What FastAPI reads as a float between 0 and 30 without a doubt: "5", "0.25", "30.0".
_WAIT = re.compile(rb"[0-9]{1,2}(\.[0-9]{1,6})?")
_ENCODINGS = {b"json": "json", b"b64": "b64"}


class HotRoutes:
    """ASGI middleware: the two hot requests to their functions, everything else to `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = route(scope) if scope["type"] == "http" else None
        if call is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await call(request)
        except Exception as exc:
            handler = _handler(scope["app"], exc)
            if handler is None:
                raise  # as the router would let it: a 500 from the outer middleware
            response = await handler(request, exc)
        await response(scope, receive, send)


def route(scope: Scope) -> Call | None:
    """The call that answers this request, or None for FastAPI's router to find its route."""
    method, path = scope["method"], scope["path"]
    if method == "POST" and path == "/v1/jobs":
        job_id = None
    elif method == "GET" and (match := _JOB_PATH.fullmatch(path)):
        job_id = match[1]
    else:
        return None
    params = query_params(scope["query_string"])
    if params is None:
        return None
    if job_id is None:
        return functools.partial(jobs.submit, **params)
    scope["path_params"] = {"job_id": job_id}
    return functools.partial(jobs.get_job, job_id, **params)


def query_params(raw: bytes) -> dict[str, Any] | None:
    """`wait` and `encoding` as FastAPI would pass them, or None for any query it should read."""
    params: dict[str, Any] = {}
    if not raw:
        return params
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        if name == b"wait" and "wait" not in params and _WAIT.fullmatch(value):
            params["wait"] = float(value)
            if params["wait"] > 30:
                return None
        elif name == b"encoding" and "encoding" not in params and value in _ENCODINGS:
            params["encoding"] = _ENCODINGS[value]
        else:
            return None
    return params


def _handler(app: Any, exc: Exception) -> Handler | None:
    """The app's handler for `exc` (its class or the nearest base), as Starlette looks it up."""
    handlers = app.exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
