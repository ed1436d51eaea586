"""Transforms (DESIGN §14): submit one, read it (with long-poll), list, cancel, retry its failed
shards. Its shards are jobs (`GET /v1/jobs?transform=<id>`); its events stream is in
api/routes/transform_events.py.

A transform is checked whole before anything is stored (api/transform_submit.py), then its row
and every shard job are committed in one transaction (db/transform_control.py), then its shards
are published, as a bulk submit's jobs are: a failed publish leaves them queued for the sweeper.
Its shards count as queued jobs for the queue's limit and the tenant's quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy import select

from api import openapi
from api.body import read_json
from api.ids import JobId
from api.key_limits import check_model
from api.metrics import PUBLISH_FAILURES
from api.schemas import error_responses, json_response
from api.state import AppState, StateDep
from api.submission import field_errors, idempotency_key
from api.transform_schemas import TransformCreate, TransformList, TransformOut
from api.transform_submit import prepare
from db import clock, transform_control, transform_keys
from db.models import Job, JobStatus, TransformStatus
from db.tenants import Caller
from db.transform_control import NewTransform, plan_shards
from db.transform_views import transform_out
from tffleet.errors import InvalidInput

router = APIRouter(prefix="/v1/transforms", tags=["transforms"])

_UNFINISHED = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


@router.post(
    "",
    status_code=202,
    response_model=TransformOut,
    responses=error_responses(400, 403, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra=openapi.TRANSFORM_SUBMIT,
)
async def submit(request: Request, state: StateDep) -> Response:
    """Run a model over every record of some files: 202 with the transform, `queued`.

    The input's files are inspected and their columns checked against the model's signature
    before anything is stored (422 naming the column); then the transform and one job per
    shard (`shard_records` records of one file) are stored together and the shards run as
    other jobs do, at a priority below interactive jobs unless `priority` says otherwise.

    With an `Idempotency-Key` header, the same request sent again (a retry after a lost
    answer) gets the transform the first one stored, as it is now (`Idempotent-Replayed:
    true`), and nothing is inspected or stored again; another request under the same key is
    409 `idempotency_key_reused`."""
    caller = await state.auth(request)
    key = idempotency_key(request.headers.get("idempotency-key"))
    body = await read_json(
        request, max_bytes=state.settings.max_body_bytes, max_items=state.settings.max_json_items
    )
    try:
        spec = TransformCreate.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(field_errors(exc)) from None
    digest = _request_hash(spec) if key is not None else None
    if key is not None:
        stored = await run_in_threadpool(_keyed, state, caller, key, digest)
        if stored is not None:
            return _answer(stored, key, replayed=True)
    check_model(caller, spec.model)  # before its files are inspected
    limits = await state.admission.limits(caller.tenant)
    new = await run_in_threadpool(prepare, state, caller, limits, spec)
    new = dataclasses.replace(new, idempotency_key=key, request_hash=digest)
    shards = len(plan_shards([f["info"]["records"] for f in new.files], new.shard_records))
    # One request: one token of the key's rate; its shards count as jobs against the caps.
    await state.admission.admit(
        shards, tenant=caller.tenant, limits=limits, caller=caller, tokens=1
    )
    out, shard_ids = await run_in_threadpool(_create, state, new)
    if out["id"] != new.id:  # a request with the same key stored it while this one ran
        stored_out, _ = await run_in_threadpool(read, state, caller, out["id"])
        return _answer(stored_out, key, replayed=True)
    if shard_ids:  # after the commit: a wake-up never names a row that is not committed
        published = await run_in_threadpool(
            functools.partial(
                state.publisher.publish, model=new.model, version=new.version, job_ids=shard_ids
            )
        )
        if not published:
            PUBLISH_FAILURES.inc()
    return _answer(out, key, replayed=False)


def _request_hash(spec: TransformCreate) -> str:
    """sha256 of the request as validated (its fields in a fixed order, defaults filled): what
    a request sent again under the same Idempotency-Key must match."""
    canonical = orjson.dumps(spec.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _keyed(state: AppState, caller: Caller, key: str, digest: str | None) -> dict[str, Any] | None:
    """The transform the caller's tenant stored under `key`, as shown now; None if none is."""
    with state.reads() as session:
        stored = transform_keys.find_keyed(
            session=session, tenant=caller.tenant, key=key, request_hash=digest
        )
        stored_id = None if stored is None else stored.id
    return None if stored_id is None else read(state, caller, stored_id)[0]


def _answer(out: dict[str, Any], key: str | None, *, replayed: bool) -> Response:
    """202 with the transform; a keyed request's answer says whether it was stored before."""
    response = json_response(out, 202)
    if key is not None:
        response.headers["Idempotent-Replayed"] = "true" if replayed else "false"
    return response


def _create(state: AppState, new: NewTransform) -> tuple[dict[str, Any], list[str]]:
    with state.sessions.begin() as session:
        transform, shard_ids = transform_control.create(session=session, new=new)
        return transform_out(transform, now=clock.now(session)), shard_ids


@router.get(
    "/{transform_id}", response_model=TransformOut, responses=error_responses(404, 422, 503)
)
async def get_transform(
    transform_id: JobId,
    request: Request,
    state: StateDep,
    wait: Annotated[
        float, Query(ge=0, le=30, description="Hold until the transform ends, seconds.")
    ] = 0,
) -> Response:
    """A transform: its counts, shards, progress and ETA; with `wait`, held until it ends or
    `wait` seconds pass."""
    caller = await state.auth(request)
    out, waiting = await run_in_threadpool(read, state, caller, transform_id, wait > 0)
    if wait > 0 and waiting:
        out = await _wait(state, caller, transform_id, waiting, wait)
    return json_response(out)


def read(
    state: AppState, caller: Caller, transform_id: str, shards: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """The transform as shown, and (with `shards`) its unfinished shards' ids, for a watch."""
    with state.reads() as session:
        transform = transform_control.get(
            session=session, transform_id=transform_id, tenant=caller.scope
        )
        running = transform_control.running(session=session, transform=transform)
        out = transform_out(transform, running=running, now=clock.now(session))
        waiting: list[str] = []
        if shards and not TransformStatus(transform.status).finished:
            waiting = list(
                session.scalars(
                    select(Job.id).where(
                        Job.transform_id == transform_id, Job.status.in_(_UNFINISHED)
                    )
                )
            )
        return out, waiting


async def _wait(
    state: AppState, caller: Caller, transform_id: str, shard_ids: list[str], wait_s: float
) -> dict[str, Any]:
    """Re-read the transform each time one of its shards is announced ended (and at least every
    `waiter.recheck_s`: an announcement lost with Redis only delays it) until it ends."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    with state.waiter.watch(*shard_ids) as woken:
        while True:
            out, _ = await run_in_threadpool(read, state, caller, transform_id)
            left = deadline - loop.time()
            if TransformStatus(out["status"]).finished or left <= 0:
                return out
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(left, state.waiter.recheck_s))
            woken.clear()


@router.get("", response_model=TransformList, responses=error_responses(400, 422, 503))
async def list_transforms(
    request: Request,
    state: StateDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """Transforms, newest first; pass `next_cursor` for the next page. A tenant's key lists its
    own, an admin's every tenant's."""
    caller = await state.auth(request)

    def run() -> dict[str, Any]:
        with state.reads() as session:
            found, next_cursor = transform_control.list_transforms(
                session=session, tenant=caller.scope, limit=limit, cursor=cursor
            )
            now = clock.now(session)
            outs = [
                transform_out(t, running=transform_control.running(session=session, transform=t),
                              now=now)
                for t in found
            ]  # fmt: skip
            return {"transforms": outs, "next_cursor": next_cursor}

    return json_response(await run_in_threadpool(run))


@router.post(
    "/{transform_id}/cancel",
    response_model=TransformOut,
    responses=error_responses(404, 409, 422, 503),
)
async def cancel(transform_id: JobId, request: Request, state: StateDep) -> Response:
    """Cancel a transform: its queued shards never start, its running ones stop at a batch
    boundary (their parts are not written); the parts written stay. 409 once it ended."""
    caller = await state.auth(request)

    def run() -> dict[str, Any]:
        with state.sessions.begin() as session:
            transform_control.cancel(
                session=session, transform_id=transform_id, tenant=caller.scope
            )
        return read(state, caller, transform_id)[0]

    return json_response(await run_in_threadpool(run))


@router.post(
    "/{transform_id}/retry",
    response_model=TransformOut,
    responses=error_responses(403, 404, 409, 410, 422, 429, 503),
)
async def retry(transform_id: JobId, request: Request, state: StateDep) -> Response:
    """Run a failed or canceled transform's failed and canceled shards again; the shards done
    are not run again. 409 while it runs or once it succeeded; 410 once a shard's spec is no
    longer stored (TFFLEET_INPUT_TTL_S after it ended)."""
    caller = await state.auth(request)
    limits = await state.admission.limits(caller.tenant)

    def count() -> int:
        with state.reads() as session:
            return transform_control.retryable(
                session=session, transform_id=transform_id, tenant=caller.scope
            )

    # Its shards to run again count against the queue's limit and the tenant's quota.
    await state.admission.admit(
        await run_in_threadpool(count), tenant=caller.tenant, limits=limits, caller=caller, tokens=1
    )

    def run() -> tuple[dict[str, Any], list[str], str, int]:
        with state.sessions.begin() as session:
            transform, shard_ids = transform_control.retry(
                session=session,
                transform_id=transform_id,
                tenant=caller.scope,
                input_ttl_s=state.settings.input_ttl_s,
            )
            check_model(caller, transform.model)  # raised here, the retry is rolled back
            model, version = transform.model, transform.version
        return read(state, caller, transform_id)[0], shard_ids, model, version

    out, shard_ids, model, version = await run_in_threadpool(run)
    published = await run_in_threadpool(
        functools.partial(state.publisher.publish, model=model, version=version, job_ids=shard_ids)
    )
    if not published:
        PUBLISH_FAILURES.inc()
    return json_response(out)
