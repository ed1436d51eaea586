"""Usage over time (DESIGN §15): `GET /v1/usage`, what the jobs that ended in a period cost, per
tenant, model or day, summed from the `usage_records` the workers append (db/usage.py).

An admin key sees every tenant; a tenant's key sees its own alone (its groups by model or day
are its own jobs', and by tenant, its one row).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from api.schemas import error_responses, json_response
from api.state import StateDep
from db import clock, usage
from db.usage import GroupBy
from db.views import iso_utc
from tffleet.errors import InvalidInput

# Without `from`: this long before `to`.
DEFAULT_SPAN = timedelta(hours=24)
# The longest period one request may sum (its hours are read and summed).
MAX_SPAN = timedelta(days=366)
# The times taken: no job ended before 1970, and past these the arithmetic above would overflow.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


class UsageGroup(BaseModel):
    """One group's sums; its key is `tenant`, `model` or `day` (YYYY-MM-DD, UTC), by `group_by`."""

    tenant: str | None = None
    model: str | None = None
    day: str | None = None
    jobs: int = Field(
        description="Jobs a worker ended, succeeded or failed (a split job once, its parts not; "
        "a job canceled before it ran cost nothing and is not counted)."
    )
    samples: int = Field(description="Samples that ran (a split job's, as its parts ran).")
    device_s: float = Field(
        description="Device seconds: the forward passes' time, each pass's split among its jobs "
        "by samples. Over a period it adds up to tffleet_device_busy_seconds_total's increase."
    )
    queue_s: float = Field(description="The jobs' seconds queued, summed.")
    run_s: float = Field(description="The jobs' seconds running, summed.")


class UsageTotal(BaseModel):
    jobs: int
    samples: int
    device_s: float
    queue_s: float
    run_s: float


class UsageOut(BaseModel):
    """What the jobs that ended in a period cost."""

    from_: datetime = Field(alias="from", description="The period's start, down to its hour.")
    to: datetime = Field(description="The period's end, up to its hour.")
    group_by: GroupBy
    tenant: str | None = Field(description="A tenant's key: its tenant; an admin's: null (all).")
    groups: list[UsageGroup]
    total: UsageTotal


router = APIRouter(tags=["usage"])


@router.get("/v1/usage", response_model=UsageOut, responses=error_responses(422, 503))
async def get_usage(
    request: Request,
    state: StateDep,
    start: Annotated[
        datetime | None,
        Query(
            alias="from",
            description="ISO 8601 (UTC unless it says; taken down to its hour), 1970 to 9998. "
            "Default: `to` less 24 hours.",
        ),
    ] = None,
    end: Annotated[
        datetime | None,
        Query(
            alias="to", description="ISO 8601 (taken up to its hour), 1970 to 9998. Default: now."
        ),
    ] = None,
    group_by: Annotated[GroupBy, Query(description="`tenant`, `model` or `day` (UTC).")] = (
        GroupBy.TENANT
    ),
) -> Response:
    """Jobs, samples, device seconds and seconds queued and running of the jobs that ended
    from `from` to `to`, summed per tenant, model or day. An admin key sees every tenant, a
    tenant's key its own."""
    caller = await state.auth(request)
    start, end = _utc(start, "from"), _utc(end, "to")
    if start is not None and end is not None and end <= start:
        raise InvalidInput(f"to: must be after `from` ({iso_utc(start)}), got {iso_utc(end)}")

    def read() -> dict[str, Any]:
        with state.reads() as session:
            until = end or clock.now(session)
            since = start or until - DEFAULT_SPAN
            if until <= since:
                raise InvalidInput(f"from: must be before `to` ({iso_utc(until)})")
            if until - since > MAX_SPAN:
                raise InvalidInput(f"from: at most {MAX_SPAN.days} days before `to`")
            groups = usage.summarize(
                session=session, start=since, end=until, group_by=group_by, tenant=caller.scope
            )
        lower, upper = usage.hour(since), usage.hour(until)
        return {
            "from": iso_utc(lower),
            "to": iso_utc(upper if upper == until else upper + usage.HOUR),
            "group_by": group_by.value,
            "tenant": caller.scope,
            "groups": groups,
            "total": usage.total(groups),
        }

    return json_response(await run_in_threadpool(read))


def _utc(value: datetime | None, field: str) -> datetime | None:
    """A time as UTC (one without an offset is taken to be UTC), from EARLIEST up to LATEST,
    or 422 naming `field`: year 1 less the default span was a 500 (OverflowError)."""
    if value is None:
        return None
    try:
        at = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # an offset that takes it past year 1 or 9999
        at = None
    if at is None or not EARLIEST <= at < LATEST:
        raise InvalidInput(
            f"{field}: must be from {iso_utc(EARLIEST)} to before {iso_utc(LATEST)}, got "
            f"{value.isoformat()}"
        )
    return at
