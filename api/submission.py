"""What every way of submitting shares: a body read into job specs, jobs checked against their
model's signature, the tenant's limits and the webhook addresses the fleet may reach before
anything is stored, idempotency keys (the header read, the keys stored), and the wait for jobs
to end. The job API (api/routes/jobs.py) and the protocol facades (api/protocols/: TF Serving,
the Open Inference Protocol) call these; none of them stores or waits any other way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
from collections.abc import Sequence
from typing import Any, Literal

import orjson
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from api import references
from api.ingest import Read, job_view
from api.key_limits import check_model
from api.schemas import JobBatchCreate, JobCreate
from api.state import AppState
from api.validation import read_binary, validate_inputs
from db import cache, jobs
from db import webhooks as db_webhooks
from db.ids import new_job_id
from db.models import FINISHED
from db.tenants import Caller, Limits
from tffleet import webhooks
from tffleet.errors import InvalidInput, InvalidRequest, TffleetError

_FINISHED = {status.value for status in FINISHED}


def _where(loc: Sequence[int | str]) -> str:
    """A field's path as a reader writes it: `jobs[3].inputs.x`."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or "body"


def field_errors(error: ValidationError) -> str:
    return "; ".join(f"{_where(item['loc'])}: {item['msg']}" for item in error.errors())


def parse(model: type[JobCreate] | type[JobBatchCreate], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(field_errors(exc)) from None


# Printable ASCII without spaces: job i > 0 of a keyed bulk request is stored under "KEY i".
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,128}$")


def idempotency_key(header: str | None) -> str | None:
    """The `Idempotency-Key` header's key (None without one); 400 for one that is no key."""
    if header is None:
        return None
    key = header.strip()
    if not _IDEMPOTENCY_KEY.match(key):
        raise InvalidRequest(
            "Idempotency-Key: must be 1 to 128 printable ASCII characters without spaces "
            "(a UUID, say)"
        )
    return key


def request_hash(new: Sequence[jobs.NewJob]) -> str:
    """sha256 of what a request asks for once resolved: model, version, priority, retention,
    deadline (`Cancel-After`, where given), webhook and its events (where given), queue time-out
    (`Queue-Timeout`, where given), inputs."""
    digest = hashlib.sha256()
    for job in new:
        # Inputs with objects of the job's own are hashed by their bytes (`content`), not
        # by keys that name the job; a reference to an upload by its key: equal bytes under
        # two uploads are two requests.
        inputs = job.content if job.content is not None else job.inputs
        head: list[object] = [job.model, job.version, job.priority, job.ttl_s, len(inputs)]
        if job.cancel_after_s is not None:  # appended: the hashes of keys stored before hold
            head.append(job.cancel_after_s)
        if job.webhook is not None:  # likewise
            head += ["webhook", job.webhook, job.webhook_events]
        if job.queue_timeout_s is not None:  # likewise
            head += ["queue_timeout", job.queue_timeout_s]
        digest.update(orjson.dumps(head))
        digest.update(inputs)
    return digest.hexdigest()


def with_key(new: list[jobs.NewJob], key: str) -> list[jobs.NewJob]:
    """Key each job: the first with the key itself, job i with "KEY i"; all with one hash."""
    digest = request_hash(new)
    return [
        dataclasses.replace(
            job, idempotency_key=key if i == 0 else f"{key} {i}", request_hash=digest
        )
        for i, job in enumerate(new)
    ]


def prepare(
    state: AppState,
    specs: Sequence[JobCreate],
    many: bool,
    caller: Caller,
    limits: Limits,
    key: str | None = None,
    *,
    cancel_after_s: float | None = None,
    queue_timeout_s: float | None = None,
    uris: references.Uris | None = None,
    staged: references.Staged | None = None,
    job_ids: Sequence[str] | None = None,
) -> list[jobs.NewJob]:
    """Check every job against its signature and the tenant's limits before anything is
    stored; a retention longer than the tenant's longest is cut to it.

    `uris`: the inputs each spec names by URI (`references.resolve`). With `staged`, inputs
    over TFFLEET_INLINE_MAX_BYTES are staged there, to be written to the object store before
    the jobs are stored (`references.ingest`); without it, all stay inline. `job_ids`: the
    jobs' ids, where objects were written under them already (a streamed body)."""
    prepared = []
    for index, spec in enumerate(specs):
        try:
            if spec.priority > limits.max_priority:
                raise InvalidInput(
                    f"priority: at most {limits.max_priority} for tenant {caller.tenant!r}, "
                    f"got {spec.priority}"
                )
            check_model(caller, spec.model)  # before the name is looked up: 403, not 404
            signature = state.signatures.resolve(spec.model, spec.version)
            named = uris[index] if uris else {}
            arrays, samples = validate_inputs(
                references.inline_inputs(spec.inputs),
                signature=signature["inputs"],
                model=spec.model,
                references={name: found.reference for name, found in named.items()},
            )
            if samples > limits.max_samples_per_job:
                raise InvalidInput(
                    f"inputs: {samples} samples; a job of tenant {caller.tenant!r} holds at most "
                    f"{limits.max_samples_per_job} (split it into several jobs)"
                )
        except TffleetError as exc:
            if many:
                exc.message = f"jobs[{index}]: {exc.message}"
            raise
        job_id = job_ids[index] if job_ids else new_job_id()
        packed = references.pack(
            arrays,
            named,
            tenant=caller.tenant,
            job_id=job_id,
            inline_max_bytes=state.settings.inline_max_bytes,
            staged=staged,
            hashed=references.hashes_read(signature, key is not None),
        )
        prepared.append(
            jobs.NewJob(
                id=job_id,
                model=signature["name"],
                version=signature["version"],
                samples=samples,
                inputs=packed.blob,
                stored_bytes=packed.stored_bytes,
                uploads=tuple(sorted({n.upload_id for n in named.values() if n.upload_id})),
                content=packed.content,
                priority=spec.priority,
                ttl_s=None if spec.ttl_s is None else min(spec.ttl_s, limits.max_ttl_s),
                tenant=caller.tenant,
                cache_key=_cache_key(signature, caller.tenant, packed.content or packed.blob),
                cancel_after_s=cancel_after_s,
                queue_timeout_s=queue_timeout_s,
                webhook=spec.webhook,
                webhook_events=(
                    None
                    if spec.webhook is None
                    else db_webhooks.bits(spec.webhook_events or ["completed"])
                ),
            )
        )
    return with_key(prepared, key) if key is not None else prepared


def prepare_binary(
    state: AppState,
    spec: JobCreate,
    body: bytes | references.Streamed,
    media: str,
    caller: Caller,
    limits: Limits,
    key: str | None = None,
    *,
    cancel_after_s: float | None = None,
    queue_timeout_s: float | None = None,
    staged: references.Staged | None = None,
) -> list[jobs.NewJob]:
    """`prepare` for a binary body: its arrays (views of `body`) are checked as a JSON body's
    tensors are, and copied once, into the stored blob (or an object staged in `staged`). A
    body streamed into the store (`references.binary_body`) was checked by its header."""
    if isinstance(body, references.Streamed):
        specs = [spec.model_copy(update={"inputs": {}})]
        return prepare(
            state, specs, False, caller, limits, key, cancel_after_s=cancel_after_s,
            queue_timeout_s=queue_timeout_s, uris=[body.uris], staged=staged,
            job_ids=[body.job_id],
        )  # fmt: skip
    inputs = read_binary(body, media)
    specs = [spec.model_copy(update={"inputs": inputs})]
    return prepare(
        state,
        specs,
        False,
        caller,
        limits,
        key,
        cancel_after_s=cancel_after_s,
        queue_timeout_s=queue_timeout_s,
        staged=staged,
    )


async def check_webhooks(state: AppState, specs: Sequence[JobCreate], many: bool) -> None:
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


def _cache_key(signature: dict[str, Any], tenant: str, packed: bytes) -> str | None:
    """The job's key in the response cache, if its model has one (`cache = true`)."""
    config = signature.get("config") or {}
    if not config.get("cache"):
        return None
    scope = cache.SHARED if config.get("cache_shared") else tenant
    return cache.key(
        model=signature["name"], version=signature["version"], scope=scope, inputs=packed
    )


async def wait_for(
    state: AppState,
    caller: Caller,
    job_ids: Sequence[str],
    *,
    wait_s: float,
    encoding: str,
    until: Literal["any", "all"] = "any",
    known: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Read the jobs (404 unless `caller` may see every one); hold until one that was unfinished
    ends (`until="all"`: until every one has), or `wait_s` passes. `known`: the jobs as the
    caller just read them, outputs left out, which saves the first read while none has ended.

    With `until="all"` the database is read again only once every pending job was announced,
    at the periodic re-check, or after the channel was lost: a wait for a thousand jobs that
    end a batch at a time costs a read or two, not one a batch. The reads while it waits leave
    queued jobs unplaced (each placing is a walk of their queue, db/standing.py): where those
    still unfinished at the end stand is read once, then."""
    read = Read(job_ids, encoding, caller.scope)
    if wait_s <= 0 or state.waiter.watches >= state.settings.max_long_polls:
        # Past the limit a long-poll is answered at once: the client asks again, and no flood of
        # held requests holds this process's memory and sockets.
        return await state.reader(read)
    peek = read._replace(placed=False)
    waiter = state.waiter
    deadline = asyncio.get_running_loop().time() + wait_s
    # Watch before the first read: an announcement between the two would otherwise be missed.
    with waiter.watch(*job_ids) as ended:
        if known is not None and not any(out["status"] in _FINISHED for out in known):
            outs = known
        else:
            outs = await state.reader(peek)
        pending = {out["id"] for out in outs if out["status"] not in _FINISHED}
        while pending:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            losses = waiter.losses
            try:
                await asyncio.wait_for(ended.wait(), min(remaining, waiter.recheck_s))
                rechecked = False
            except TimeoutError:
                rechecked = True
            ended.clear()
            if (
                until == "all"
                and not rechecked
                and waiter.losses == losses
                and not all(waiter.announced(job_id) for job_id in pending)
            ):
                continue
            # Woken by an announcement, or by the periodic re-check: the database decides,
            # unless the workers announced every job still pending whole.
            outs = _from_announcements(state, outs, pending, encoding) or await state.reader(peek)
            ended_now = {out["id"] for out in outs if out["status"] in _FINISHED} & pending
            pending -= ended_now
            if ended_now and until == "any":
                break
        if pending:
            # Where the unfinished ones stand, and the others as they ended since the last read
            # (`until="all"` reads only once all were announced).
            outs = await state.reader(read)
        return outs


def _from_announcements(
    state: AppState, outs: list[dict[str, Any]], pending: set[str], encoding: str
) -> list[dict[str, Any]] | None:
    """`outs` with the pending jobs as their workers announced them, or None unless all were."""
    announced = {job_id: state.waiter.ended(job_id) for job_id in pending}
    if any(job is None for job in announced.values()):
        return None
    return [job_view(job, encoding) if (job := announced.get(out["id"])) else out for out in outs]
