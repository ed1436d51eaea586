"""The models the fleet serves, with their signatures."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool

from api.schemas import ModelList, error_responses, iso_utc, json_response
from api.state import StateDep
from db import registry

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, responses=error_responses(503))
async def list_models(state: StateDep) -> Response:
    """Every registered model version, with its input and output signature."""

    def read() -> list[dict[str, object]]:
        with state.reads() as session:
            return [
                {
                    "name": m.name,
                    "version": m.version,
                    "format": m.format,
                    "inputs": m.inputs,
                    "outputs": m.outputs,
                    "config": m.config,
                    "registered_at": iso_utc(m.registered_at),
                }
                for m in registry.list_versions(session=session)
            ]

    return json_response({"models": await run_in_threadpool(read)})
