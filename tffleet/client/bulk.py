"""A bulk submission as a plan (see `tffleet.client.protocol`): many jobs in requests of at most
`chunk_size` jobs or `chunk_bytes` of body, each stored all or none, in order.

A refused request stops it; the error it raises carries the jobs of the earlier requests (which
stay stored, `.submitted`) and counts jobs in its message from the first of the whole call, not
of its request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

from tffleet.client.errors import ClientError, HTTPStatusError, ProtocolError
from tffleet.client.job import Job
from tffleet.client.plans import (
    CancelAfter,
    cancel_after_headers,
    dumps,
    job_body,
    new_idempotency_key,
    progress_bar,
    submit_call,
    webhook_fields,
    with_headers,
)
from tffleet.client.protocol import Plan, Retries, send

MAX_JOBS_PER_REQUEST = 10_000  # the API's limit on a bulk submit or a bulk status read

# A bulk submit's error names the job by its index in the request, "jobs[3].priority: ..." or
# "jobs[3]: inputs.x: ..." (one part per error, "; " between); "jobs.3" is an older spelling.
_JOB_INDEX = re.compile(r"(^|; )jobs(\[|\.)(\d+)")


def submit_many(
    model: str,
    inputs_list: Iterable[Any],
    *,
    version: int | None,
    priority: int,
    chunk_size: int,
    chunk_bytes: int,
    idempotency_key: str | None,
    progress: bool | None,
    retries: Retries,
    cancel_after: CancelAfter = None,
    webhook: str | None = None,
    webhook_events: Sequence[str] | None = None,
) -> Plan[list[Job]]:
    """One bulk request per `chunk_size` jobs or `chunk_bytes` of body, in order.

    Each request is stored all or none. If one is refused, the jobs of the earlier ones stay
    submitted: the error's `.submitted` lists them, and its message counts jobs from the first.
    With an `idempotency_key`, request n carries "KEY.n": the same call again (same inputs and
    chunking) gets the jobs stored before instead of new ones. `webhook` and `webhook_events`
    go with every job.
    """
    if not 1 <= chunk_size <= MAX_JOBS_PER_REQUEST:
        raise ValueError(f"chunk_size must be 1 to {MAX_JOBS_PER_REQUEST}, got {chunk_size}")
    fields = webhook_fields(webhook, webhook_events)
    bodies = (
        dumps({**job_body(model, inputs, version=version, priority=priority), **fields})
        for inputs in inputs_list
    )
    total = len(inputs_list) if isinstance(inputs_list, Sized) else None
    extend = with_headers(cancel_after_headers(cancel_after))
    submitted: list[Job] = []
    with progress_bar(progress, total, "submit") as bar:
        for n, chunk in enumerate(_chunked_bodies(bodies, chunk_size, chunk_bytes)):
            key = f"{idempotency_key}.{n}" if idempotency_key else new_idempotency_key()
            call = extend(submit_call(b'{"jobs":[' + b",".join(chunk) + b"]}", key))
            try:
                data = yield from send(call, retries)
                jobs = [Job.from_wire(job) for job in data["jobs"]]
            except ClientError as exc:
                raise _after(exc, submitted) from exc.__cause__
            except (KeyError, TypeError) as exc:
                raise ProtocolError(f"not a bulk submit answer: {exc!r}") from None
            if len(jobs) != len(chunk):
                raise ProtocolError(f"sent {len(chunk)} jobs, {len(jobs)} came back")
            submitted.extend(jobs)
            bar.update(len(jobs))
    return submitted


def _chunked_bodies(
    bodies: Iterable[bytes], chunk_size: int, chunk_bytes: int
) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    size = 0
    for body in bodies:
        if chunk and (len(chunk) >= chunk_size or size + len(body) + 1 > chunk_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(body)
        size += len(body) + 1
    if chunk:
        yield chunk


def _after(exc: ClientError, submitted: list[Job]) -> ClientError:
    """The error of one chunk, as the caller of submit_many should see it."""
    if isinstance(exc, HTTPStatusError) and submitted:
        # The API counts jobs within its request; count them from the first of the whole call.
        message = _JOB_INDEX.sub(
            lambda m: f"{m[1]}jobs{m[2]}{int(m[3]) + len(submitted)}", exc.message
        )
        exc = type(exc).from_answer(exc.status_code, exc.code, message, response=exc.response)
    exc.submitted = list(submitted)
    return exc
