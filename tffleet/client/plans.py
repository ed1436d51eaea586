"""The client's operations as plans (see `tffleet.client.protocol`), shared by both clients.

Submit one job, read, long-poll one job or many, cancel, retry, delete, list the models; and
what every submit sends (a job's body, its headers). A plan yields `Call`s and `Sleep`s and
returns what the client method returns. A bulk submission is `tffleet.client.bulk`'s.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import orjson
from tqdm import tqdm

from tffleet.client.errors import (
    InvalidInput,
    ProtocolError,
    UnsupportedMediaType,
    WaitTimeout,
)
from tffleet.client.job import Job, ModelInfo, binary_inputs, encode_inputs
from tffleet.client.objects import DEFAULT_INLINE_MAX_BYTES, read_job, upload_large
from tffleet.client.protocol import ACCEPT_NPZ, Call, Plan, Retries, Sleep, send

MAX_POLL_S = 30.0  # the longest `wait` the API holds a request for
IDS_PER_STATUS_READ = 1_000
MIN_ROUND_S = 0.05  # between polling rounds that found jobs unfinished: completions batch up
# `wait_all`'s rounds: each answer costs the API a read of every job still pending, and each job
# that ended since, a fetch of its outputs; so while many are pending, completions gather a
# little longer (16 pending: 0.21 s), never past MAX_ROUND_S.
ROUND_S_PER_PENDING = 0.01
MAX_ROUND_S = 0.25
# A wait with a bar holds a round this long at most, so that the bar moves while jobs run.
PROGRESS_ROUND_S = 1.0
AUTO_PROGRESS_MIN_JOBS = 100


def job_body(model: str, inputs: Any, *, version: int | None, priority: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "inputs": encode_inputs(inputs)}
    if version is not None:
        body["version"] = version
    if priority:
        body["priority"] = priority
    return body


CancelAfter = float | str | timedelta | None


def cancel_after_headers(
    cancel_after: CancelAfter, queue_timeout: CancelAfter = None
) -> dict[str, str]:
    """The `Cancel-After` and `Queue-Timeout` headers, where given: seconds (a number or a
    timedelta), or a duration as the API reads it ("90s", "1h30m"), passed on as it is."""
    return {
        **_duration_header("Cancel-After", "cancel_after", cancel_after),
        **_duration_header("Queue-Timeout", "queue_timeout", queue_timeout),
    }


def _duration_header(header: str, name: str, value: CancelAfter) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        return {header: value}
    if not value > 0:
        raise ValueError(f"{name} must be more than 0 seconds, got {value!r}")
    # Fixed-point: the API reads no exponent ("1e-05").
    return {header: f"{value:.6f}".rstrip("0").rstrip(".")}


def with_headers(headers: dict[str, str]) -> Callable[[Call], Call]:
    def extend(call: Call) -> Call:
        return dataclasses.replace(call, headers={**(call.headers or {}), **headers})

    return extend


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


def submit_call(body: bytes, idempotency_key: str) -> Call:
    return Call("POST", "/v1/jobs", content=body, headers={"Idempotency-Key": idempotency_key})


def _submit_one(
    model: str,
    inputs: Any,
    *,
    version: int | None,
    priority: int,
    idempotency_key: str,
    retries: Retries,
    extend: Callable[[Call], Call] = lambda call: call,
    fields: dict[str, Any] | None = None,
    inline_max_bytes: int | None = DEFAULT_INLINE_MAX_BYTES,
) -> Plan[Any]:
    """Send one job's submit (`extend` adds to the request): large arrays as a binary body
    (.npz or .npy, the job's other fields in the query), else JSON; JSON too where the API
    refuses the binary body (415: an API from before binary bodies, which stored nothing).
    `fields`: more of the job's fields (its webhook), in the body or the query alike. An array
    over `inline_max_bytes` is uploaded first (`tffleet.client.objects`): the job, JSON then,
    names it by URI."""
    fields = fields or {}
    inputs = yield from upload_large(inputs, inline_max_bytes=inline_max_bytes, retries=retries)
    binary = binary_inputs(inputs)
    if binary is not None:
        content, content_type = binary
        params = {"model": model}
        if version is not None:
            params["version"] = str(version)
        if priority:
            params["priority"] = str(priority)
        for name, value in fields.items():
            params[name] = ",".join(value) if isinstance(value, list) else str(value)
        headers = {"Idempotency-Key": idempotency_key, "Content-Type": content_type}
        call = Call("POST", "/v1/jobs", params=params, content=content, headers=headers)
        try:
            return (yield from send(extend(call), retries))
        except UnsupportedMediaType:
            pass
    body = dumps({**job_body(model, inputs, version=version, priority=priority), **fields})
    return (yield from send(extend(submit_call(body, idempotency_key)), retries))


def webhook_fields(webhook: str | None, webhook_events: Sequence[str] | None) -> dict[str, Any]:
    """A job's `webhook` and `webhook_events`, where given."""
    fields: dict[str, Any] = {}
    if webhook is not None:
        fields["webhook"] = webhook
    if webhook_events is not None:
        fields["webhook_events"] = list(webhook_events)
    return fields


def submit(
    model: str,
    inputs: Any,
    *,
    version: int | None,
    priority: int,
    idempotency_key: str | None,
    retries: Retries,
    cancel_after: CancelAfter = None,
    webhook: str | None = None,
    webhook_events: Sequence[str] | None = None,
    inline_max_bytes: int | None = DEFAULT_INLINE_MAX_BYTES,
    queue_timeout: CancelAfter = None,
) -> Plan[Job]:
    answer = yield from _submit_one(
        model,
        inputs,
        version=version,
        priority=priority,
        idempotency_key=idempotency_key or new_idempotency_key(),
        retries=retries,
        extend=with_headers(cancel_after_headers(cancel_after, queue_timeout)),
        fields=webhook_fields(webhook, webhook_events),
        inline_max_bytes=inline_max_bytes,
    )
    return (yield from read_job(answer, retries=retries))


def get(job_id: str, *, encoding: str, wait_s: float, retries: Retries) -> Plan[Job]:
    """One job; with binary outputs asked for (`b64`), a job that has succeeded comes back as an
    .npz of its outputs."""
    params = {"encoding": encoding}
    if wait_s > 0:
        params["wait"] = f"{wait_s:.3f}"
    headers = {"Accept": ACCEPT_NPZ} if encoding == "b64" else None
    path = f"/v1/jobs/{quote(job_id, safe='')}"
    call = Call("GET", path, params=params, headers=headers, wait_s=wait_s)
    return (yield from read_job((yield from send(call, retries)), retries=retries))


def get_many(
    job_ids: Sequence[str], *, encoding: str, wait_s: float, retries: Retries
) -> Plan[list[Job]]:
    """The jobs, in the order given. With `wait_s`, held until one of the first
    `IDS_PER_STATUS_READ` unfinished ones ends; the rest are read as they are."""
    found: dict[str, Job] = {}
    unique = list(dict.fromkeys(job_ids))
    for start in range(0, len(unique), IDS_PER_STATUS_READ):
        ids = unique[start : start + IDS_PER_STATUS_READ]
        held = wait_s if start == 0 else 0.0
        for job in (yield from _status(ids, encoding=encoding, wait_s=held, retries=retries)):
            found[job.id] = job
    try:
        return [found[job_id] for job_id in job_ids]
    except KeyError as exc:
        raise ProtocolError(f"job {exc} missing from the status answer") from None


def _status(
    ids: Sequence[str],
    *,
    encoding: str,
    wait_s: float,
    retries: Retries,
    until: str | None = None,
) -> Plan[list[Job]]:
    """One `POST /v1/jobs/status` of at most `IDS_PER_STATUS_READ` distinct ids, held up to
    `wait_s` until one of them ends (`until="all"`: until every one has)."""
    body: dict[str, Any] = {"ids": list(ids), "encoding": encoding, "wait": round(wait_s, 3)}
    if until is not None:
        body["until"] = until
    data = yield from send(Call("POST", "/v1/jobs/status", content=dumps(body)), retries)
    try:
        wire = list(data["jobs"])
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"not a status answer: {exc!r}") from None
    jobs = []
    for item in wire:
        jobs.append((yield from read_job(item, retries=retries)))
    return jobs


def wait(job_id: str, *, timeout: float | None, retries: Retries) -> Plan[Job]:
    """Long-poll in rounds of up to `MAX_POLL_S` until the job finishes or `timeout` passes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        started = time.monotonic()
        job = yield from get(job_id, encoding="b64", wait_s=hold_s(deadline), retries=retries)
        if job.finished:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"job {job_id} still {job.status} after {timeout} s", jobs=[job])
        yield from _pause(started, deadline)


def wait_all(
    job_ids: Sequence[str], *, timeout: float | None, progress: bool | None, retries: Retries
) -> Plan[list[Job]]:
    """Wait for every job; each round re-reads only those still unfinished, so each job's
    outputs come over once. Returns them in the order given.

    A round holds the oldest `IDS_PER_STATUS_READ` pending jobs until every one of them has
    ended (`until: "all"`), and reads no others: a tenant's queue runs oldest first, so each
    job is read about once, the next ones run while the last are read, and the last answer
    comes as the last job ends. An API from before `until` answers as soon as one of the held
    jobs ends; its rounds are paced instead, and read every pending job."""
    deadline = None if timeout is None else time.monotonic() + timeout
    latest: dict[str, Job] = {}
    pending = list(dict.fromkeys(job_ids))
    until: str | None = "all"
    with progress_bar(progress, len(pending), "wait", bar_format=WAIT_BAR_FORMAT) as bar:
        while pending:
            started = time.monotonic()
            held = pending[:IDS_PER_STATUS_READ] if until else pending
            wait_s = hold_s(deadline, PROGRESS_ROUND_S if not bar.disable else MAX_POLL_S)
            try:
                if until:
                    jobs = yield from _status(
                        held, encoding="b64", wait_s=wait_s, until=until, retries=retries
                    )
                else:
                    jobs = yield from get_many(held, encoding="b64", wait_s=wait_s, retries=retries)
            except InvalidInput as exc:
                if until is None or "until:" not in str(exc):
                    raise
                until = None
                continue
            latest.update((job.id, job) for job in jobs)
            still = {job.id for job in jobs if not job.finished}
            bar.update(len(held) - len(still))
            failed = sum(1 for job in latest.values() if job.finished and not job.ok)
            if failed:
                bar.set_postfix(failed=failed, refresh=False)
            # Each id once, in the order given, the oldest first (the next round's held ones).
            done = {job.id for job in jobs} - still
            pending = [job_id for job_id in pending if job_id not in done]
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                yield from _timed_out(job_ids, latest, pending, timeout=timeout, retries=retries)
            if until is None or still.intersection(held):
                # Answered before all the held jobs ended (an old API, one past its limit of
                # held requests, or the bar's round): completions gather before the next round.
                yield from _pause(started, deadline, round_s=_gather_s(len(pending)))
    return [latest[job_id] for job_id in job_ids]


def _timed_out(
    job_ids: Sequence[str],
    latest: dict[str, Job],
    pending: list[str],
    *,
    timeout: float | None,
    retries: Retries,
) -> Plan[None]:
    """Raise `WaitTimeout` with every job as last seen, in the order given: those no round
    held, read now."""
    unread = [job_id for job_id in pending if job_id not in latest]
    if unread:
        jobs = yield from get_many(unread, encoding="b64", wait_s=0, retries=retries)
        latest.update((job.id, job) for job in jobs)
    unfinished = sum(1 for job in latest.values() if not job.finished)
    raise WaitTimeout(
        f"{unfinished} of {len(latest)} jobs unfinished after {timeout} s",
        jobs=[latest[job_id] for job_id in job_ids],
    )


def hold_s(deadline: float | None, most_s: float = MAX_POLL_S) -> float:
    """How long a round may hold a request: `most_s`, or less where `deadline` comes first."""
    if deadline is None:
        return most_s
    return max(0.0, min(most_s, deadline - time.monotonic()))


def _gather_s(pending: int) -> float:
    return min(MAX_ROUND_S, MIN_ROUND_S + ROUND_S_PER_PENDING * pending)


def _pause(started: float, deadline: float | None, round_s: float = MIN_ROUND_S) -> Plan[None]:
    """Not before `round_s` since the round began: a server that answers at once (an old one,
    or one finishing jobs one by one) is not polled in a tight loop."""
    until = started + round_s
    if deadline is not None:
        until = min(until, deadline)
    left = until - time.monotonic()
    if left > 0:
        yield Sleep(left)


def cancel(job_id: str, *, retries: Retries) -> Plan[Job]:
    # Canceling twice is not an error, so a cancel is safe to send again.
    call = Call("POST", f"/v1/jobs/{quote(job_id, safe='')}/cancel")
    return (yield from read_job((yield from send(call, retries)), retries=retries))


def retry(
    job_id: str, *, cancel_after: CancelAfter, retries: Retries, queue_timeout: CancelAfter = None
) -> Plan[Job]:
    # Sent again after a lost answer, a retry that went through answers 409 (now queued).
    headers = cancel_after_headers(cancel_after, queue_timeout) or None
    call = Call("POST", f"/v1/jobs/{quote(job_id, safe='')}/retry", headers=headers)
    return (yield from read_job((yield from send(call, retries)), retries=retries))


def delete(job_id: str, *, retries: Retries) -> Plan[None]:
    # Sent again after a lost answer, a delete that went through answers 404.
    yield from send(Call("DELETE", f"/v1/jobs/{quote(job_id, safe='')}"), retries)


def webhook_secret(*, retries: Retries) -> Plan[str]:
    data = yield from send(Call("GET", "/v1/webhooks/secret"), retries)
    try:
        return str(data["secret"])
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"not a webhook secret: {exc!r}") from None


def models(*, retries: Retries) -> Plan[list[ModelInfo]]:
    data = yield from send(Call("GET", "/v1/models"), retries)
    try:
        return [ModelInfo.from_wire(item) for item in data["models"]]
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"not a model list: {exc!r}") from None


def run(
    model: str,
    inputs: Any,
    *,
    version: int | None,
    priority: int,
    timeout: float | None,
    retries: Retries,
    inline_max_bytes: int | None = DEFAULT_INLINE_MAX_BYTES,
) -> Plan[dict[str, Any]]:
    # Submit and long-poll in one round trip (POST ?wait=); a job still unfinished when that
    # round ends is then waited for as usual.
    deadline = None if timeout is None else time.monotonic() + timeout
    wait_s = hold_s(deadline)

    def waiting(call: Call) -> Call:
        return dataclasses.replace(
            call,
            params={**(call.params or {}), "wait": f"{wait_s:.3f}", "encoding": "b64"},
            headers={**(call.headers or {}), "Accept": ACCEPT_NPZ},
            wait_s=wait_s,
        )

    answer = yield from _submit_one(
        model,
        inputs,
        version=version,
        priority=priority,
        idempotency_key=new_idempotency_key(),
        retries=retries,
        extend=waiting,
        inline_max_bytes=inline_max_bytes,
    )
    done = yield from read_job(answer, retries=retries)
    if not done.finished:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        done = yield from wait(done.id, timeout=remaining, retries=retries)
    outputs = done.raise_for_error().outputs
    if outputs is None:
        raise ProtocolError(f"job {done.id} succeeded but its outputs are gone (purged?)")
    return outputs


# `wait_all`'s bar: counts and the time waited, no rate. Its count grows by the jobs each poll
# finds ended, which ended while earlier rounds waited or before the wait began: a rate of
# results collected ("19850.45job/s" for jobs long done) says nothing of how fast jobs run.
WAIT_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} ended [{elapsed}{postfix}]"


def progress_bar(
    progress: bool | None, total: int | None, what: str, *, bar_format: str | None = None
) -> tqdm[Any]:
    """`progress` True or False; None: shown for many jobs when stderr is a terminal."""
    if progress is None:
        progress = (total or 0) > AUTO_PROGRESS_MIN_JOBS and sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=what,
        unit="job",
        disable=not progress,
        dynamic_ncols=True,
        bar_format=bar_format,
    )
