"""The client's operations as plans (see `tffleet.client.protocol`), shared by both clients.

Submit one job (and wait for it: `run`), cancel, retry, delete, list the models; and what every
submit sends (a job's body, its headers). A plan yields `Call`s and `Sleep`s and returns what the
client method returns. Reads and waits are `tffleet.client.waiting`'s, a bulk submission
`tffleet.client.bulk`'s.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import orjson

from tffleet.client.errors import (
    ProtocolError,
    UnsupportedMediaType,
)
from tffleet.client.job import Job, ModelInfo, binary_inputs, encode_inputs
from tffleet.client.objects import DEFAULT_INLINE_MAX_BYTES, read_job, upload_large
from tffleet.client.protocol import ACCEPT_NPZ, Call, Plan, Retries, send
from tffleet.client.waiting import hold_s, wait


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
