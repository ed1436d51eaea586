"""Submit (one or many), poll (with long-poll), bulk status, cancel, retry, delete and list jobs."""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from api.body import INLINE_BYTES, read_bytes, read_json
from api.deadlines import cancel_after_s
from api.ingest import BLOB
from api.metrics import PUBLISH_FAILURES, SUBMIT_SECONDS
from api.schemas import (
    JOB_ID_MAX_LENGTH,
    JobBatchCreate,
    JobBatchOut,
    JobCreate,
    JobList,
    JobOut,
    JobStatusQuery,
    error_responses,
    json_response,
)
from api.state import AppState, StateDep, get_state
from api.submission import field_errors, parse, prepare, wait_for
from api.validation import read_binary
from db import jobs, standing
from db.models import FINISHED, JobStatus
from db.tenants import Caller, Limits
from db.views import job_out
from tffleet import tensors, webhooks
from tffleet.errors import (
    InvalidInput,
    InvalidRequest,
    JobNotFound,
    UnsupportedMediaType,
)

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

Encoding = Literal["json", "b64"]
_FINISHED = {status.value for status in FINISHED}


# OpenAPI: a binary body or answer (.npz, .npy), and the query parameters a binary body comes with.
_BINARY_SCHEMA = {"schema": {"type": "string", "format": "binary"}}
_BINARY_PARAMETERS = [
    {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": f"With a binary body only (a JSON body gives it in the body): {text}",
    }
    for name, schema, text in (
        ("model", {"type": "string", "maxLength": 200}, "the model; required."),
        ("version", {"type": "integer", "minimum": 1}, "the model's version."),
        ("priority", {"type": "integer", "minimum": -1000, "maximum": 1000}, "the priority."),
        ("ttl_s", {"type": "integer", "minimum": 1}, "keep the job this long after it ends."),
        ("webhook", {"type": "string", "maxLength": 2000}, "an http(s) URL for its webhooks."),
        (
            "webhook_events",
            {"type": "string", "examples": ["completed", "start,completed"]},
            "the webhook's events, comma-separated.",
        ),
    )
]
_CANCEL_AFTER_PARAMETER = {
    "name": "Cancel-After",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 40, "examples": ["30", "1.5", "90s", "1h30m"]},
    "description": "Cancel each job not ended this long after it is stored (error `deadline`): "
    "seconds, or a Go-style duration.",
}


@router.post(
    "",
    status_code=202,
    response_model=JobOut | JobBatchOut,
    responses={
        **error_responses(400, 404, 409, 413, 415, 422, 429, 503),
        202: {"content": {tensors.NPZ: _BINARY_SCHEMA}},
    },
    openapi_extra={
        "parameters": [
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "maxLength": 128},
                "description": "The same key and body again: the same job, nothing new stored.",
            },
            _CANCEL_AFTER_PARAMETER,
            *_BINARY_PARAMETERS,
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "anyOf": [
                            {"$ref": "#/components/schemas/JobCreate"},
                            {"$ref": "#/components/schemas/JobBatchCreate"},
                        ]
                    }
                },
                tensors.NPZ: _BINARY_SCHEMA,
                tensors.NPY: _BINARY_SCHEMA,
            },
        },
    },
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
    (409 if its body differs). 429 while the queue is full.

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
    after it is stored is canceled, queued or running, with error `deadline`.
    """
    started = time.perf_counter()
    state = get_state(request)  # not a dependency: solving one costs more than the call
    caller = await state.auth(request)  # before the body: a stranger costs no parsing
    key = _idempotency_key(request.headers.get("idempotency-key"))
    deadline = cancel_after_s(request.headers.get("cancel-after"))
    media = _media_type(request.headers.get("content-type", ""))
    check: functools.partial[list[jobs.NewJob]]
    if media in _BINARY:
        body = await read_bytes(request, max_bytes=state.settings.max_body_bytes)
        specs, many = [_binary_spec(request)], False
        check = functools.partial(
            _prepare_binary, state, specs[0], body, media, cancel_after_s=deadline
        )
    elif _is_json(media):
        _no_binary_parameters(request)
        body = await read_json(
            request,
            max_bytes=state.settings.max_body_bytes,
            max_items=state.settings.max_json_items,
        )
        many = isinstance(body, dict) and "jobs" in body
        specs = parse(JobBatchCreate, body).jobs if many else [parse(JobCreate, body)]
        check = functools.partial(prepare, state, specs, many, cancel_after_s=deadline)
    else:
        raise UnsupportedMediaType(f"Content-Type must be one of {', '.join(_ACCEPTED)}")
    await _check_webhooks(state, specs, many)
    declared = request.headers.get("content-length", "")
    small = declared.isdigit() and int(declared) < INLINE_BYTES
    limits = await state.admission.limits(caller.tenant)
    if small and all(state.signatures.cached(s.model, s.version) for s in specs):
        new = check(caller, limits, key)
    else:
        new = await run_in_threadpool(check, caller, limits, key)
    await state.admission.admit(len(new), tenant=caller.tenant, limits=limits)
    ingested = await state.ingestor(new)
    SUBMIT_SECONDS.observe(time.perf_counter() - started)
    outs = ingested.jobs
    npz = not many and _accepts_npz(request)
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
        outs = await state.reader((ids, BLOB if npz else encoding, caller.scope))
    outs = _shown(caller, outs)
    if many:
        response = json_response({"jobs": outs}, 202)
    else:
        response = await _answer(outs[0], encoding=encoding, status_code=202)
    if key is not None:
        response.headers["Idempotent-Replayed"] = "true" if ingested.replayed else "false"
    return response


# Binary bodies (one job): what each holds, and the query parameters that say the rest.
_BINARY = (tensors.NPZ, tensors.NPY)
_ACCEPTED = ("application/json", *_BINARY)
_QUERY_FIELDS = ("model", "version", "priority", "ttl_s", "webhook", "webhook_events")


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    # As api.body reads it: application/json, or any application/...+json.
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _accepts_npz(request: Request) -> bool:
    """Whether the Accept header lists application/x-npz (and not with q=0)."""
    accept = request.headers.get("accept", "").lower()
    if tensors.NPZ not in accept:
        return False
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media == tensors.NPZ:
            for param in params:
                name, _, value = param.partition("=")
                if name.strip() == "q":
                    try:
                        return float(value) > 0
                    except ValueError:
                        return False
            return True
    return False


def _no_binary_parameters(request: Request) -> None:
    given = [name for name in _QUERY_FIELDS if name in request.query_params]
    if given:
        raise InvalidInput(
            f"{given[0]}: a query parameter only with a binary body ({', '.join(_BINARY)}); "
            "a JSON body gives it in the body"
        )


def _binary_spec(request: Request) -> JobCreate:
    """The job a binary body comes with, from the query parameters, checked as a JSON body's
    fields are (with the same messages); its inputs are read from the body later."""
    query = request.query_params
    fields: dict[str, Any] = {name: query[name] for name in _QUERY_FIELDS if name in query}
    if "webhook_events" in query:
        fields["webhook_events"] = [
            event.strip()
            for given in query.getlist("webhook_events")
            for event in given.split(",")
            if event.strip()
        ]
    return parse(JobCreate, {**fields, "inputs": {}})


async def _check_webhooks(state: AppState, specs: Sequence[JobCreate], many: bool) -> None:
    """422 naming `webhook` where a job's webhook host is, or resolves to, an address the fleet
    must not reach (TFFLEET_WEBHOOK_ALLOW_PRIVATE). Resolved off the event loop; only for jobs
    that have one. The deliverer checks the address again before each attempt."""
    urls = {spec.webhook: index for index, spec in enumerate(specs) if spec.webhook is not None}
    if not urls:
        return
    allow = state.settings.webhook_allow_private

    def check() -> None:
        for url, index in urls.items():
            try:
                webhooks.check(url, allow_private=allow)
            except webhooks.WebhookAddressError as exc:
                where = f"jobs[{index}].webhook" if many else "webhook"
                raise InvalidInput(f"{where}: {exc}") from None

    await run_in_threadpool(check)


def _prepare_binary(
    state: AppState,
    spec: JobCreate,
    body: bytes,
    media: str,
    caller: Caller,
    limits: Limits,
    key: str | None = None,
    *,
    cancel_after_s: float | None = None,
) -> list[jobs.NewJob]:
    """`prepare` for a binary body: its arrays (views of `body`) are checked as a JSON body's
    tensors are, and copied once, into the stored blob."""
    inputs = read_binary(body, media)
    specs = [spec.model_copy(update={"inputs": inputs})]
    return prepare(state, specs, False, caller, limits, key, cancel_after_s=cancel_after_s)


# Printable ASCII without spaces: job i > 0 of a keyed bulk request is stored under "KEY i".
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,128}$")


def _idempotency_key(header: str | None) -> str | None:
    if header is None:
        return None
    key = header.strip()
    if not _IDEMPOTENCY_KEY.match(key):
        raise InvalidRequest(
            "Idempotency-Key: must be 1 to 128 printable ASCII characters without spaces "
            "(a UUID, say)"
        )
    return key


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
        **error_responses(404, 422, 503),
        200: {"content": {tensors.NPZ: _BINARY_SCHEMA}},
    },
)
async def get_job(
    job_id: Annotated[str, Path(max_length=JOB_ID_MAX_LENGTH)],
    request: Request,
    wait: Annotated[float, Query(ge=0, le=30, description="Hold until the job ends, seconds.")] = 0,
    encoding: Annotated[Encoding, Query(description="`b64`: binary outputs.")] = "json",
) -> Response:
    """A job; with `wait`, held until it finishes or `wait` seconds pass.

    With `Accept: application/x-npz`, a job that has succeeded is answered as an .npz of its
    outputs (read back by `np.load`), the job itself (outputs null) as JSON in the
    `Tffleet-Job` header; any other job, or one with string outputs, as JSON as usual: the
    answer's Content-Type says which.
    """
    state = get_state(request)
    caller = await state.auth(request)
    npz = _accepts_npz(request)
    outs = await wait_for(state, caller, [job_id], wait_s=wait, encoding=BLOB if npz else encoding)
    response = await _answer(_shown(caller, outs)[0], encoding=encoding)
    response.headers["Vary"] = "Accept"
    return response


# Outputs up to this size are written into an .npz on the event loop: a thread hop would cost
# more.
_INLINE_NPZ_BYTES = 64 * 1024


async def _answer(out: dict[str, Any], *, encoding: Encoding, status_code: int = 200) -> Response:
    """A job as JSON, or, where it was read with its outputs as their stored blob (`BLOB`), as
    an .npz of them with the job in the `Tffleet-Job` header (JSON, outputs null)."""
    blob = out["outputs"]
    if not isinstance(blob, bytes):
        return json_response(out, status_code)
    out["outputs"] = None
    try:
        if len(blob) <= _INLINE_NPZ_BYTES:
            body = tensors.npz_of_blob(blob)
        else:
            body = await run_in_threadpool(tensors.npz_of_blob, blob)
    except tensors.TensorError:  # string outputs: no .npy holds them without pickle
        outputs = tensors.unpack(blob)
        out["outputs"] = {name: tensors.encode(a, encoding=encoding) for name, a in outputs.items()}
        return json_response(out, status_code)
    headers = {
        "Tffleet-Job": json.dumps(out, ensure_ascii=True, separators=(",", ":")),
        "Content-Disposition": f'attachment; filename="{out["id"]}.npz"',
    }
    return Response(body, status_code=status_code, media_type=tensors.NPZ, headers=headers)


@router.post(
    "/status",
    response_model=JobBatchOut,
    responses=error_responses(400, 404, 413, 415, 422, 503),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/JobStatusQuery"}}
            },
        }
    },
)
async def status_many(request: Request, state: StateDep) -> Response:
    """Many jobs by id, in the order given; with `wait`, held until one of them ends."""
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
    outs = await wait_for(state, caller, query.ids, wait_s=query.wait, encoding=query.encoding)
    return json_response({"jobs": _shown(caller, outs)})


@router.post(
    "/{job_id}/cancel", response_model=JobOut, responses=error_responses(404, 409, 422, 503)
)
async def cancel(
    job_id: Annotated[str, Path(max_length=JOB_ID_MAX_LENGTH)], request: Request, state: StateDep
) -> Response:
    """Cancel a queued or running job (409 if it already finished)."""
    caller = await state.auth(request)

    if "\x00" in job_id:  # no job has one, and PostgreSQL refuses NUL in a query
        raise JobNotFound(f"job {job_id!r} not found")

    def run() -> dict[str, Any]:
        with state.sessions.begin() as session:
            job = jobs.cancel(session=session, job_id=job_id, tenant=caller.scope)
            return job_out(job, with_outputs=False)

    return json_response(_shown(caller, [await run_in_threadpool(run)])[0])


@router.post(
    "/{job_id}/retry",
    response_model=JobOut,
    responses=error_responses(404, 409, 410, 422, 429, 503),
    openapi_extra={"parameters": [_CANCEL_AFTER_PARAMETER]},
)
async def retry(
    job_id: Annotated[str, Path(max_length=JOB_ID_MAX_LENGTH)], request: Request, state: StateDep
) -> Response:
    """Run a failed or canceled job again under its id: `queued`, its error and outputs cleared,
    a fresh attempt budget (`attempts` keeps counting). 409 for a queued, running or succeeded
    job; 410 if its inputs are no longer stored. `Cancel-After` gives it a new deadline."""
    caller = await state.auth(request)
    deadline = cancel_after_s(request.headers.get("cancel-after"))
    if "\x00" in job_id:  # no job has one, and PostgreSQL refuses NUL in a query
        raise JobNotFound(f"job {job_id!r} not found")
    limits = await state.admission.limits(caller.tenant)
    await state.admission.admit(1, tenant=caller.tenant, limits=limits)

    def run() -> dict[str, Any]:
        with state.sessions.begin() as session:
            job = jobs.retry(
                session=session, job_id=job_id, tenant=caller.scope, cancel_after_s=deadline
            )
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
async def delete_job(
    job_id: Annotated[str, Path(max_length=JOB_ID_MAX_LENGTH)], request: Request, state: StateDep
) -> Response:
    """Delete an ended job now, with its inputs and outputs (204). 409 while it is queued or
    running: cancel it first."""
    caller = await state.auth(request)
    if "\x00" in job_id:
        raise JobNotFound(f"job {job_id!r} not found")

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
) -> Response:
    """Jobs, newest first, filtered by status and model; pass `next_cursor` for the next page.
    A tenant's key lists its own jobs, an admin's every tenant's."""
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
            )
            # Where the queued ones stand: one statement per model version of them, not per job.
            placed = standing.place(session=session, jobs=found, recent=state.reader.recent)
            outs = [job_out(job, with_outputs=False, standing=placed.get(job.id)) for job in found]
            return {"jobs": _shown(caller, outs), "next_cursor": next_cursor}

    return json_response(await run_in_threadpool(run))
