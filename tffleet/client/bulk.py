"""A bulk submission as a plan (see `tffleet.client.protocol`): many jobs in requests of at most
`chunk_size` jobs or `chunk_bytes` of body, each stored all or none, in order.

A refused request stops it; the error it raises carries the jobs of the earlier requests (which
stay stored, `.submitted`) and counts jobs in its message from the first of the whole call, not
of its request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence, Sized
from typing import Any

from tffleet.client.errors import ClientError, HTTPStatusError, ProtocolError
from tffleet.client.job import Job
from tffleet.client.objects import DEFAULT_INLINE_MAX_BYTES, read_job, upload_large
from tffleet.client.plans import (
    CancelAfter,
    cancel_after_headers,
    dumps,
    job_body,
    new_idempotency_key,
    submit_call,
    webhook_fields,
    with_headers,
)
from tffleet.client.protocol import Plan, Retries, send
from tffleet.client.waiting import progress_bar

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
    inline_max_bytes: int | None = DEFAULT_INLINE_MAX_BYTES,
    queue_timeout: CancelAfter = None,
) -> Plan[list[Job]]:
    """One bulk request per `chunk_size` jobs or `chunk_bytes` of body, in order.

    Each request is stored all or none. If one is refused, the jobs of the earlier ones stay
    submitted: the error's `.submitted` lists them, and its message counts jobs from the first.
    With an `idempotency_key`, request n carries "KEY.n": the same call again (same inputs and
    chunking) gets the jobs stored before instead of new ones (not for inputs uploaded: each
    call uploads them anew, under new URIs). `cancel_after`, `queue_timeout`, `webhook` and
    `webhook_events` go with every job.
    An array over `inline_max_bytes` is uploaded first and its job names it by URI.
    """
    if not 1 <= chunk_size <= MAX_JOBS_PER_REQUEST:
        raise ValueError(f"chunk_size must be 1 to {MAX_JOBS_PER_REQUEST}, got {chunk_size}")
    fields = webhook_fields(webhook, webhook_events)
    total = len(inputs_list) if isinstance(inputs_list, Sized) else None
    extend = with_headers(cancel_after_headers(cancel_after, queue_timeout))
    submitted: list[Job] = []
    chunk: list[bytes] = []
    size = 0
    sent: list[int] = []  # the jobs of each request sent, so far

    def flush() -> Plan[None]:
        key = f"{idempotency_key}.{len(sent)}" if idempotency_key else new_idempotency_key()
        sent.append(len(chunk))
        call = extend(submit_call(b'{"jobs":[' + b",".join(chunk) + b"]}", key))
        try:
            data = yield from send(call, retries)
            wire = list(data["jobs"])
        except ClientError as exc:
            raise _after(exc, submitted) from exc.__cause__
        except (KeyError, TypeError) as exc:
            raise ProtocolError(f"not a bulk submit answer: {exc!r}") from None
        if len(wire) != len(chunk):
            raise ProtocolError(f"sent {len(chunk)} jobs, {len(wire)} came back")
        for job in wire:  # a job answered from the response cache has its outputs
            submitted.append((yield from read_job(job, retries=retries)))
        bar.update(len(wire))

    with progress_bar(progress, total, "submit") as bar:
        for inputs in inputs_list:
            # Arrays over the inline limit go first, each its own upload; the job names them.
            named = yield from upload_large(
                inputs, inline_max_bytes=inline_max_bytes, retries=retries
            )
            body = dumps({**job_body(model, named, version=version, priority=priority), **fields})
            if chunk and (len(chunk) >= chunk_size or size + len(body) + 1 > chunk_bytes):
                yield from flush()
                chunk, size = [], 0
            chunk.append(body)
            size += len(body) + 1
        if chunk:
            yield from flush()
    return submitted


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
