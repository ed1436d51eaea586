"""Submit (one or many), poll (with long-poll), bulk status, cancel, retry, delete and list jobs."""

from __future__ import annotations

import functools
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from api import negotiation, openapi, references
from api.body import INLINE_BYTES, read_json
from api.deadlines import cancel_after_s, queue_timeout_s
from api.ids import JobId
from api.ingest import BLOB, Read
from api.key_limits import check_model
from api.metrics import PUBLISH_FAILURES, SUBMIT_SECONDS
from api.negotiation import Encoding
from api.schemas import (
    ErrorOut,
    JobBatchCreate,
    JobBatchOut,
    JobCreate,
    JobList,
    JobOut,
    JobStatusQuery,
    error_responses,
    json_response,
)
from api.state import StateDep, get_state
from api.submission import (
    check_webhooks,
    field_errors,
    idempotency_key,
    parse,
    prepare,
    prepare_binary,
    wait_for,
)
from db import jobs, standing
from db.models import JobStatus
from db.tenants import Caller
from db.views import job_out
from tffleet.errors import InvalidInput, UnsupportedMediaType

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post(
    "",
    status_code=202,
    response_model=JobOut | JobBatchOut,
    responses={
        **error_responses(400, 403, 404, 409, 413, 415, 422, 429, 503),
        202: openapi.NPZ_ANSWER,
    },
    openapi_extra=openapi.SUBMIT,
)
async def submit(
    request: Request,
    wait: Annotated[
        float, Query(ge=0, le=30, description="Hold until every job ends, seconds.")
    ] = 0,
    encoding: Annotated[Encoding, Query(description="`b64`: binary outputs.")] = "json",
) -> Response:
    """Validate jobs against their model's signature, store them, and wake a worker.

    The body is one job, or `{"jobs": [job, ...]}` to submit many at once (all or none).
    With an `Idempotency-Key` header, a request sent again gets the jobs the first one stored
    (409 if its body differs). 429 while the queue is full, or past the tenant's quota or the
    key's rate or cap on active jobs (`rate_limited`: each job takes a token of its rate); 403
    for a model the key may not use.

    With `wait`, the answer is held until every job of the request has ended (outputs
    included) or `wait` seconds pass: submit and long-poll in one round trip. It is 202 either
    way; the jobs' `status` says whether they ended.

    Large tensors travel cheaper as a binary body, for one job: `Content-Type:
    application/x-npz` (what `np.savez` writes: one member per input, by name) or
    `application/x-npy` (what `np.save` writes: the one input of a single-input model), with
    `model`, `version`, `priority` and `ttl_s` as query parameters. With `Accept:
    application/x-npz`, a single job that has succeeded by the answer (with `wait`) is answered
    as an .npz of its outputs, the job itself in the `Tffleet-Job` header, as `GET` does.

    With a `Cancel-After` header (`30`, `1.5`, `90s`, `1h30m`), each job not ended that long
    after it is stored is canceled, queued or running, with error `deadline`; with a
    `Queue-Timeout` header, each job no worker started that long after it is stored is canceled
    without running, with error `queue_timeout`.
    """
    started = time.perf_counter()
    state = get_state(request)  # not a dependency: solving one costs more than the call
    caller = await state.auth(request)  # before the body: a stranger costs no parsing
    key = idempotency_key(request.headers.get("idempotency-key"))
    deadline = cancel_after_s(request.headers.get("cancel-after"))
    queue_timeout = queue_timeout_s(request.headers.get("queue-timeout"))
    media = negotiation.media_type(request.headers.get("content-type", ""))
    check: functools.partial[list[jobs.NewJob]]
    # Inputs over TFFLEET_INLINE_MAX_BYTES, to be written to the object store (api/references.py).
    staged = references.Staged()
    if media in negotiation.BINARY:
        specs, many = [negotiation.binary_spec(request)], False
        # A large .npy may be streamed into the store (written once its header is checked).
        body = await references.binary_body(state, request, caller, specs[0], media, staged)
        check = functools.partial(
            prepare_binary,
            state,
            specs[0],
            body,
            media,
            cancel_after_s=deadline,
            queue_timeout_s=queue_timeout,
            staged=staged,
        )
    elif negotiation.is_json(media):
        negotiation.no_binary_parameters(request)
        body = await read_json(
            request,
            max_bytes=state.settings.max_body_bytes,
            max_items=state.settings.max_json_items,
        )
        many = isinstance(body, dict) and "jobs" in body
        specs = parse(JobBatchCreate, body).jobs if many else [parse(JobCreate, body)]
        uris = await references.resolve(state, caller, specs, many)
        check = functools.partial(
            prepare,
            state,
            specs,
            many,
            cancel_after_s=deadline,
            queue_timeout_s=queue_timeout,
            uris=uris,
            staged=staged,
        )
    else:
        raise UnsupportedMediaType(f"Content-Type must be one of {', '.join(negotiation.ACCEPTED)}")
    try:
        await check_webhooks(state, specs, many)
        declared = request.headers.get("content-length", "")
        small = declared.isdigit() and int(declared) < INLINE_BYTES
        limits = await state.admission.limits(caller.tenant)
        # A streamed body's job holds references only: as cheap to check as a small body's.
        inline = small or isinstance(body, references.Streamed)
        if inline and all(state.signatures.cached(s.model, s.version) for s in specs):
            new = check(caller, limits, key)
        else:
            new = await run_in_threadpool(check, caller, limits, key)
        await state.admission.admit(len(new), tenant=caller.tenant, limits=limits, caller=caller)
        ingested = await references.ingest(state, new, staged, placed=wait <= 0)
    except BaseException:
        await references.discard(state, staged)  # a streamed body no job came of
        raise
    SUBMIT_SECONDS.observe(time.perf_counter() - started)
    outs = ingested.jobs
    npz = not many and negotiation.accepts_npz(request)
    if wait > 0:
        # The jobs as just stored: a first read would only say what `outs` says. An ending
        # announced before the watch starts is remembered by the waiter.
        try:
            outs = await wait_for(
                state, caller, [out["id"] for out in outs], wait_s=wait,
                encoding=BLOB if npz else encoding, until="all", known=outs,
            )  # fmt: skip
        except SQLAlchemyError as exc:
            # The jobs are stored: an error now would make a client that retries without a
            # key store them twice. Answer with them as stored; they are polled by id later.
            log.warning("database error while waiting on stored jobs (%s); answering 202", exc)
    elif any(out["cached"] for out in outs):
        # Some ended at once, answered from the response cache: read them, outputs and all.
        ids = [out["id"] for out in outs]
        outs = await state.reader(Read(ids, BLOB if npz else encoding, caller.scope))
    outs = _shown(caller, outs)
    if many:
        response = json_response({"jobs": outs}, 202)
    else:
        response = await negotiation.answer(
            outs[0],
            encoding=encoding,
            status_code=202,
            store=state.objects,
            max_stored_bytes=state.settings.max_body_bytes,
            stored_errors=False,  # the job is stored: answered, its outputs fetched later
        )
    if key is not None:
        response.headers["Idempotent-Replayed"] = "true" if ingested.replayed else "false"
    return response


def _shown(caller: Caller, outs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs as `caller` may see them: which worker ran a job (host, pid) is for admins."""
    if not caller.admin:
        for out in outs:
            out["worker"] = None
    return outs


@router.get(
    "/{job_id}",
    response_model=JobOut,
    responses={
        **error_responses(404, 410, 422, 503),
        200: openapi.NPZ_ANSWER,
        410: {
            "model": ErrorOut,
            "description": "An .npz answer: an output's object is no longer in the store.",
        },
    },
)
async def get_job(
    job_id: JobId,
    request: Request,
    wait: Annotated[float, Query(ge=0, le=30, description="Hold until the job ends, seconds.")] = 0,
    encoding: Annotated[Encoding, Query(description="`b64`: binary outputs.")] = "json",
) -> Response:
    """A job; with `wait`, held until it finishes or `wait` seconds pass.

    With `Accept: application/x-npz`, a job that has succeeded is answered as an .npz of its
    outputs (read back by `np.load`), the job itself (outputs null) as JSON in the
    `Tffleet-Job` header, outputs held in the object store read into it (up to
    TFFLEET_MAX_BODY_BYTES of them; 410 for one gone from the store, 503 while it does not
    answer); any other job, one with string outputs, or one with more than that in the store,
    as JSON as usual: the answer's Content-Type says which.
    """
    state = get_state(request)
    caller = await state.auth(request)
    npz = negotiation.accepts_npz(request)
    outs = await wait_for(state, caller, [job_id], wait_s=wait, encoding=BLOB if npz else encoding)
    response = await negotiation.answer(
        _shown(caller, outs)[0],
        encoding=encoding,
        store=state.objects,
        max_stored_bytes=state.settings.max_body_bytes,
    )
    response.headers["Vary"] = "Accept"
    return response


@router.post(
    "/status",
    response_model=JobBatchOut,
    responses=error_responses(400, 404, 413, 415, 422, 503),
    openapi_extra=openapi.STATUS,
)
async def status_many(request: Request, state: StateDep) -> Response:
    """Many jobs by id, in the order given; with `wait`, held until one of them ends (`until:
    "all"`: every one)."""
    caller = await state.auth(request)
    body = await read_json(
        request,
        max_bytes=state.settings.max_body_bytes,
        max_items=state.settings.max_json_items,
    )
    try:
        query = JobStatusQuery.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(field_errors(exc)) from None
    outs = await wait_for(
        state, caller, query.ids, wait_s=query.wait, encoding=query.encoding, until=query.until
    )
    return json_response({"jobs": _shown(caller, outs)})


@router.post(
    "/{job_id}/cancel", response_model=JobOut, responses=error_responses(404, 409, 422, 503)
)
async def cancel(job_id: JobId, request: Request, state: StateDep) -> Response:
    """Cancel a queued or running job (409 if it already finished)."""
    caller = await state.auth(request)

    def run() -> dict[str, Any]:
        with state.sessions.begin() as session:
            job = jobs.cancel(session=session, job_id=job_id, tenant=caller.scope)
            return job_out(job, with_outputs=False)

    return json_response(_shown(caller, [await run_in_threadpool(run)])[0])


@router.post(
    "/{job_id}/retry",
    response_model=JobOut,
    responses=error_responses(403, 404, 409, 410, 422, 429, 503),
    openapi_extra=openapi.RETRY,
)
async def retry(job_id: JobId, request: Request, state: StateDep) -> Response:
    """Run a failed or canceled job again under its id: `queued`, its error and outputs cleared,
    a fresh attempt budget (`attempts` keeps counting). 409 for a queued, running or succeeded
    job; 410 once its inputs are no longer stored (TFFLEET_INPUT_TTL_S after it ended).
    `Cancel-After` gives it a new deadline, `Queue-Timeout` a new queue time-out."""
    caller = await state.auth(request)
    deadline = cancel_after_s(request.headers.get("cancel-after"))
    queue_timeout = queue_timeout_s(request.headers.get("queue-timeout"))
    limits = await state.admission.limits(caller.tenant)
    await state.admission.admit(1, tenant=caller.tenant, limits=limits, caller=caller)

    def run() -> dict[str, Any]:
        with state.sessions.begin() as session:
            job = jobs.retry(
                session=session,
                job_id=job_id,
                tenant=caller.scope,
                cancel_after_s=deadline,
                queue_timeout_s=queue_timeout,
                input_ttl_s=state.settings.input_ttl_s,
            )
            check_model(caller, job.model)  # raised here, the retry is rolled back
            # Where it stands, as a submit's answer says: the queue it joins, in its transaction.
            placed = standing.place(session=session, jobs=[job], recent=state.reader.recent)
            return job_out(job, with_outputs=False, standing=placed.get(job.id))

    out = await run_in_threadpool(run)
    # After the commit, as a submit's: a failed publish leaves it queued for the sweeper.
    published = await run_in_threadpool(
        functools.partial(
            state.publisher.publish, model=out["model"], version=out["version"], job_ids=[job_id]
        )
    )
    if not published:
        PUBLISH_FAILURES.inc()
    return json_response(_shown(caller, [out])[0])


@router.delete("/{job_id}", status_code=204, responses=error_responses(404, 409, 422, 503))
async def delete_job(job_id: JobId, request: Request, state: StateDep) -> Response:
    """Delete an ended job now, with its inputs and outputs (204). 409 while it is queued or
    running: cancel it first."""
    caller = await state.auth(request)

    def run() -> None:
        with state.sessions.begin() as session:
            jobs.remove(session=session, job_id=job_id, tenant=caller.scope)

    await run_in_threadpool(run)
    return Response(status_code=204)


@router.get("", response_model=JobList, responses=error_responses(400, 422, 503))
async def list_jobs(
    request: Request,
    state: StateDep,
    status: JobStatus | None = None,
    # No NUL: PostgreSQL refuses it in a query, and no model name has one.
    model: Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00]*$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    transform: Annotated[
        str | None,
        Query(max_length=64, pattern=r"^[^\x00]*$", description="Only this transform's shards."),
    ] = None,
) -> Response:
    """Jobs, newest first, filtered by status and model; pass `next_cursor` for the next page.
    A tenant's key lists its own jobs, an admin's every tenant's. A transform's shards are
    listed only with `transform=<id>`."""
    caller = await state.auth(request)

    def run() -> dict[str, Any]:
        with state.reads() as session:
            found, next_cursor = jobs.list_jobs(
                session=session,
                tenant=caller.scope,
                status=status,
                model=model,
                limit=limit,
                cursor=cursor,
                transform=transform,
            )
            # Where the queued ones stand: one statement per model version of them, not per job.
            placed = standing.place(session=session, jobs=found, recent=state.reader.recent)
            outs = [job_out(job, with_outputs=False, standing=placed.get(job.id)) for job in found]
            return {"jobs": _shown(caller, outs), "next_cursor": next_cursor}

    return json_response(await run_in_threadpool(run))
