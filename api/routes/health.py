"""Liveness, readiness and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.schemas import error_responses, json_response
from api.state import AppState, StateDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> Response:
    """The process is up."""
    return json_response({"status": "ok"})


@router.get(
    "/readyz", responses={503: {"description": "The database or the broker is unreachable."}}
)
async def readyz(state: StateDep) -> Response:
    """The database and the broker are reachable."""

    checks = await run_in_threadpool(readiness, state)
    ready = all(v == "ok" for v in checks.values())
    return json_response(
        {"status": "ok" if ready else "unavailable", **checks}, 200 if ready else 503
    )


def readiness(state: AppState) -> dict[str, str]:
    """Whether the database and the broker answer: "ok", or why not, for each."""
    checks = {}
    try:
        with state.reads() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        state.publisher.ping()
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"unreachable: {type(exc).__name__}"
    return checks


# 200 is text, the errors JSON: a `response_class` of text would document them as text too.
_METRICS_TEXT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The Prometheus text format.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


@router.get(
    "/metrics", response_class=Response, responses={**_METRICS_TEXT, **error_responses(403)}
)
async def metrics(request: Request, state: StateDep) -> Response:
    """Prometheus metrics, each model's backlog among them (an admin key, unless public)."""
    if not state.settings.metrics_public:
        await state.auth.admin(request)
    # The backlog gauges read the database: off the event loop.
    body = await run_in_threadpool(generate_latest, request.app.state.metrics)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
