"""The models the fleet serves: signatures, configs, and which workers hold which versions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.schemas import ModelList, error_responses, json_response
from api.state import StateDep
from db import clock, presence, registry
from db.models import ModelPresence
from db.views import iso_utc


def _worker(row: ModelPresence) -> dict[str, Any]:
    return {
        "worker": row.child,
        "host": row.host,
        "pid": row.pid,
        "device": row.device,
        "state": row.state,
        "since": iso_utc(row.since),
    }


def _load_error(row: ModelPresence) -> dict[str, Any]:
    return {
        "model": row.name,
        "version": row.version or None,  # 0: the model's model.toml
        "path": row.path,
        "error": row.error or "",
        **_worker(row),
    }


router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, responses=error_responses(503))
async def list_models(request: Request, state: StateDep) -> Response:
    """Every registered model version: its signature and config, the live workers that hold it,
    its unfinished jobs; and the versions workers failed to load (workers and load errors name
    hosts, processes and paths: an admin key sees them, a tenant's sees none)."""
    admin = (await state.auth(request)).admin

    def read() -> dict[str, Any]:
        with state.reads() as session:
            found = registry.overview(
                session=session,
                live_since=presence.live_since(state.settings.model_poll_s, clock.now(session)),
            )
            models = [
                {
                    "name": v.model.name,
                    "version": v.model.version,
                    "format": v.model.format,
                    "inputs": v.model.inputs,
                    "outputs": v.model.outputs,
                    "config": v.model.config,
                    "registered_at": iso_utc(v.model.registered_at),
                    "latest": v.latest,
                    "served": v.served,
                    "retired": v.retired,
                    "retired_at": iso_utc(v.model.retired_at),
                    "workers": [_worker(row) for row in v.holders] if admin else [],
                    "queued": v.queued,
                    "running": v.running,
                }
                for v in found.versions
            ]
            errors = [_load_error(row) for row in found.load_errors] if admin else []
            return {"models": models, "load_errors": errors}

    return json_response(await run_in_threadpool(read))
