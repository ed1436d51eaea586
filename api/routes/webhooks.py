"""The caller's webhook signing secret."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from api.schemas import error_responses, json_response
from api.state import StateDep
from db import webhooks

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


class WebhookSecretOut(BaseModel):
    secret: str = Field(description="`whsec_` and base64: verify deliveries' signatures with it.")


@router.get("/secret", response_model=WebhookSecretOut, responses=error_responses(503))
async def webhook_secret(request: Request, state: StateDep) -> Response:
    """The secret that signs the webhooks of the caller's tenant (made on first use)."""
    caller = await state.auth(request)

    def run() -> str:
        with state.sessions() as session:
            return webhooks.secret(session=session, tenant=caller.tenant)

    return json_response({"secret": await run_in_threadpool(run)})
