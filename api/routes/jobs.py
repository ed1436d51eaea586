"""Submit, poll (with long-poll), cancel and list jobs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy.orm import undefer

from api.body import read_json
from api.metrics import JOBS_SUBMITTED, PUBLISH_FAILURES, SUBMIT_SECONDS
from api.schemas import JobCreate, JobList, JobOut, job_out, json_response
from api.state import AppState, StateDep
from api.validation import validate_inputs
from db import jobs
from db.models import FINISHED, Job, JobStatus
from tffleet import tensors
from tffleet.errors import InvalidInput, JobNotFound

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

Encoding = Literal["json", "b64"]


def _field_errors(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "body"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


@router.post("", status_code=202, response_model=JobOut)
async def submit(request: Request, state: StateDep) -> Response:
    """Validate a job against its model's signature, store it, and wake a worker."""
    started = time.perf_counter()
    body = await read_json(request, max_bytes=state.settings.max_body_bytes)
    try:
        spec = JobCreate.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(_field_errors(exc)) from None
    out = await run_in_threadpool(_submit, state, spec)
    SUBMIT_SECONDS.observe(time.perf_counter() - started)
    return json_response(out, 202)


def _submit(state: AppState, spec: JobCreate) -> dict[str, Any]:
    signature = state.signatures.resolve(spec.model, spec.version)
    arrays, samples = validate_inputs(spec.inputs, signature=signature["inputs"], model=spec.model)
    new = jobs.NewJob(
        model=signature["name"],
        version=signature["version"],
        samples=samples,
        inputs=tensors.pack(arrays),
        priority=spec.priority,
    )
    # Commit first, then publish: a wake-up never names a job the database does not have.
    with state.sessions.begin() as session:
        (job,) = jobs.create(session=session, jobs=[new])
        out = job_out(job, with_outputs=False)
    JOBS_SUBMITTED.labels(model=new.model).inc()
    if not state.publisher.publish(model=new.model, version=new.version, job_ids=[job.id]):
        PUBLISH_FAILURES.inc()
    return out


def _read(state: AppState, job_id: str, encoding: Encoding) -> dict[str, Any]:
    with state.reads() as session:
        job = session.get(Job, job_id, options=[undefer(Job.outputs)])
        if job is None:
            raise JobNotFound(f"job {job_id!r} not found")
        return job_out(job, encoding=encoding)


_FINISHED = {status.value for status in FINISHED}


@router.get("/{job_id}", response_model=JobOut)
async def get_job(
    job_id: str,
    state: StateDep,
    wait: Annotated[float, Query(ge=0, le=30, description="Hold until the job ends, seconds.")] = 0,
    encoding: Annotated[Encoding, Query(description="`b64`: binary outputs.")] = "json",
) -> Response:
    """A job; with `wait`, held until it finishes or `wait` seconds pass."""
    if wait <= 0:
        return json_response(await run_in_threadpool(_read, state, job_id, encoding))
    deadline = asyncio.get_running_loop().time() + wait
    with state.waiter.watch(job_id) as ended:
        while True:
            ended.clear()
            out = await run_in_threadpool(_read, state, job_id, encoding)
            remaining = deadline - asyncio.get_running_loop().time()
            if out["status"] in _FINISHED or remaining <= 0:
                return json_response(out)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), min(remaining, state.waiter.recheck_s))


@router.post("/{job_id}/cancel", response_model=JobOut)
async def cancel(job_id: str, state: StateDep) -> Response:
    """Cancel a queued or running job (409 if it already finished)."""

    def run() -> dict[str, Any]:
        with state.sessions.begin() as session:
            return job_out(jobs.cancel(session=session, job_id=job_id), with_outputs=False)

    return json_response(await run_in_threadpool(run))


@router.get("", response_model=JobList)
async def list_jobs(
    state: StateDep,
    status: JobStatus | None = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """Jobs, newest first, filtered by status and model; pass `next_cursor` for the next page."""

    def run() -> dict[str, Any]:
        with state.reads() as session:
            found, next_cursor = jobs.list_jobs(
                session=session, status=status, model=model, limit=limit, cursor=cursor
            )
            return {
                "jobs": [job_out(j, with_outputs=False) for j in found],
                "next_cursor": next_cursor,
            }

    return json_response(await run_in_threadpool(run))
