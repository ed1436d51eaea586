"""The operator's console: a page (`/console`) and the two admin reads it polls.

The page and its script and styles are files of the package (api/console/), served as they
are: no CDN, no build step, so it works on an air-gapped cluster. It asks for an admin key and
keeps it in the browser's session storage; the key goes in the `Authorization` header of the
reads, never in a URL.

    GET /v1/console/overview    models and who holds them, devices, tenants, the last minutes'
                                throughput and latency, the latest failures, storage (admin)
    GET /v1/console/jobs/{id}   one job: its timeline, and its outputs' shapes (admin)

The overview is read at most once a second per API process, however many consoles poll it.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session

from api.ids import JobId
from api.schemas import error_responses, json_response
from api.state import AppState, get_state
from db import (
    clock,
    console,
    jobs,
    objects,
    presence,
    registry,
    size,
    standing,
    tenants,
    transform_control,
    usage,
)
from db.backlog import per_model as backlog_per_model
from db.models import JobStatus, ModelPresence
from db.tenants import Limits
from db.views import iso_utc, job_out, output_uri
from tffleet import tensors

ASSETS = Path(__file__).resolve().parent.parent / "console"
# The charts' span: the last this many whole minutes and the current one.
MINUTES = 15
# How far back the latest failures are looked for.
FAILURES_SINCE = timedelta(hours=24)
# One read of the overview serves every console polling within this many seconds.
_FRESH_S = 1.0
# A minute this long past its end is settled: no job ending in it is still to be committed.
_SETTLED = timedelta(seconds=30)
# Storage (the database's size, a count of the kept inputs) changes slowly: read this seldom.
_STORAGE_FRESH_S = 10.0
# The tenants' device seconds over the last hour (usage_records: a row per batch) read this seldom.
_USAGE_FRESH_S = 5.0

router = APIRouter(tags=["console"])


@router.get("/console", include_in_schema=False)
async def page() -> Response:
    """The console page (no key needed to load it; every read it makes takes an admin key)."""
    return FileResponse(ASSETS / "index.html", media_type="text/html")


@router.get("/v1/console/overview", responses=error_responses(401, 403, 503))
async def overview(request: Request) -> Response:
    """The fleet at a glance, for the console: each model version with the live children
    holding it (host, device, state, busy share) and its queued and running jobs and oldest
    queued age; the models stalled past TFFLEET_STALL_WARN_S (jobs queued, children ready, no
    claim: `stalled`); the devices; the tenants with their queued jobs, quotas and device
    seconds over the last hour; jobs ended and their latency per minute over the last 15
    minutes; the latest failures; storage (the database's size, the jobs that keep their
    inputs, and how long each thing is kept); the latest transforms with their progress. Admin
    keys only."""
    state = get_state(request)
    await state.auth.admin(request)
    cache: _Cache | None = getattr(request.app.state, "console_overview", None)
    if cache is None:
        cache = request.app.state.console_overview = _Cache()
    return json_response(await cache.get(state))


class _Cache:
    """The last overview read, shared by every request within `_FRESH_S` (one read at a time),
    and the minutes long past, which no longer change: each read scans only the last two."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._at = float("-inf")
        self._value: dict[str, Any] = {}
        self.closed: dict[datetime, console.Minute] = {}
        self.storage: dict[str, Any] = {}
        self.storage_at = float("-inf")
        self.device_s: dict[str, float] = {}
        self.device_s_at = float("-inf")

    async def get(self, state: AppState) -> dict[str, Any]:
        async with self._lock:
            if time.monotonic() - self._at > _FRESH_S:
                self._value = await run_in_threadpool(_read_overview, state, self)
                self._at = time.monotonic()
            return self._value

    def keep(self, minutes: list[console.Minute], now: datetime) -> None:
        """Remember the minutes that ended over `_SETTLED` ago (a job's end is committed
        moments after the time it records), and forget those out of the charts' span."""
        self.closed = {
            m.start: m for m in minutes if m.start + timedelta(minutes=1) + _SETTLED <= now
        }


def _read_overview(state: AppState, cache: _Cache) -> dict[str, Any]:
    settings = state.settings
    with state.reads() as session:
        now = clock.now(session)
        since = presence.live_since(settings.model_poll_s, now)
        backlog = _Backlog(console.unfinished(session=session))
        # The backlog is scanned once: its counts are the models' too.
        found = registry.overview(session=session, live_since=since, counts=backlog.per_version)
        minutes = console.minutes(session=session, now=now, count=MINUTES, known=cache.closed)
        failures = console.latest_failures(session=session, since=now - FAILURES_SINCE)
        known = tenants.list_tenants(session=session)
        recent_transforms = transform_control.recent(session=session, now=now)
        # What the gauges say (tffleet_model_stalled_seconds): the console warns past the setting.
        per_model = backlog_per_model(session=session, poll_s=settings.model_poll_s, now=now)
        if time.monotonic() - cache.storage_at > _STORAGE_FRESH_S:
            cache.storage, cache.storage_at = _storage(session, state), time.monotonic()
        if time.monotonic() - cache.device_s_at > _USAGE_FRESH_S:
            cache.device_s = usage.device_by_tenant(session=session, now=now)
            cache.device_s_at = time.monotonic()
    cache.keep(minutes, now)

    def age_s(model: str, version: int) -> float | None:
        at = backlog.oldest.get((model, version))
        return None if at is None else max(0.0, (now - at).total_seconds())

    defaults = Limits.defaults(settings)
    tenant_rows = {t.name: t for t in known}
    return {
        "now": iso_utc(now),
        "models": [
            {
                "name": v.model.name,
                "version": v.model.version,
                "format": v.model.format,
                "latest": v.latest,
                "served": v.served,
                "retired": v.retired,
                "queued": v.queued,
                "running": v.running,
                "oldest_queued_s": age_s(v.model.name, v.model.version),
                "holders": [_holder(row) for row in v.holders],
            }
            for v in found.versions
        ],
        # Models whose jobs wait beside ready children and none claimed for TFFLEET_STALL_WARN_S:
        # consumers connected but not consuming (docs: operate-and-recover.md#a-stalled-model).
        "stall_warn_s": settings.stall_warn_s,
        "stalled": [
            {
                "model": name,
                "queued": b.queued,
                "ready_children": b.ready_children,
                "stalled_s": b.stalled_s,
            }
            for name, b in per_model.items()
            if b.stalled_s > settings.stall_warn_s
        ],
        "load_errors": [
            {"model": r.name, "version": r.version or None, "error": r.error or "", **_holder(r)}
            for r in found.load_errors
        ],
        "devices": _devices(found.live),
        "tenants": [
            {
                "name": name,
                "weight": defaults.over(tenant_rows.get(name)).weight,
                "max_queued_jobs": defaults.over(tenant_rows.get(name)).max_queued_jobs,
                **backlog.per_tenant.get(name, {"queued": 0, "running": 0}),
                # Its jobs' device seconds over the last hour (db/usage.py).
                "device_s_1h": cache.device_s.get(name, 0.0),
            }
            for name in sorted(set(tenant_rows) | set(backlog.per_tenant) | set(cache.device_s))
        ],
        "minutes": [
            {
                "start": iso_utc(m.start),
                "ended": m.ended,
                "failed": m.failed,
                "canceled": m.canceled,
                "p50_ms": m.p50_ms,
                "p95_ms": m.p95_ms,
            }
            for m in minutes
        ],
        "failures": [
            {
                "id": job.id,
                "tenant": job.tenant,
                "model": job.model,
                "version": job.version,
                "code": job.error_code,
                "message": job.error_message or "",
                "finished_at": iso_utc(job.finished_at),
            }
            for job in failures
        ],
        "storage": cache.storage,
        "transforms": recent_transforms,
    }


def _storage(session: Session, state: AppState) -> dict[str, Any]:
    """The database's size, the object store's (as the database accounts for it), the jobs that
    keep their inputs (and their bytes where cheap to know), and the retentions in force: what
    the fleet keeps, and for how long."""
    kept = size.inputs(session=session)
    stored_objects, stored_bytes = objects.stored_size(session=session)
    settings = state.settings
    return {
        "database_bytes": size.database_bytes(session=session),
        "object_store_bytes": stored_bytes,
        "object_store_objects": stored_objects,
        "upload_ttl_s": settings.upload_ttl_s,
        "inputs_kept": kept.kept,
        "inputs_bytes": kept.bytes,
        "input_ttl_s": settings.input_ttl_s,
        "result_ttl_s": settings.result_ttl_s,
        "cache_ttl_s": settings.cache_ttl_s,
        "cache_max_bytes": settings.cache_max_bytes,
    }


class _Backlog:
    """The unfinished jobs' counts per model version and per tenant, and each version's oldest
    queued job, from the one scan of them (`console.unfinished`)."""

    def __init__(self, rows: list[console.Unfinished]) -> None:
        self.per_version: dict[tuple[str, int], dict[str, int]] = {}
        self.per_tenant: dict[str, dict[str, int]] = {}
        self.oldest: dict[tuple[str, int], datetime] = {}
        for row in rows:
            key = (row.model, row.version)
            for counts in (
                self.per_version.setdefault(key, {"queued": 0, "running": 0}),
                self.per_tenant.setdefault(row.tenant, {"queued": 0, "running": 0}),
            ):
                counts["queued"] += row.queued
                counts["running"] += row.running
            at = self.oldest.get(key)
            if row.oldest_queued_at is not None and (at is None or row.oldest_queued_at < at):
                self.oldest[key] = row.oldest_queued_at


def _holder(row: ModelPresence) -> dict[str, Any]:
    return {
        "host": row.host,
        "pid": row.pid,
        "device": row.device,
        "state": row.state,
        "since": iso_utc(row.since),
        "busy": row.busy,
    }


def _devices(live: list[ModelPresence]) -> list[dict[str, Any]]:
    """Each live child (one per device and host): what it holds and how busy it kept its
    device over the last minute (the sum over the models it ran)."""
    children: dict[str, dict[str, Any]] = {}
    for row in live:
        child = children.setdefault(
            row.child,
            {"host": row.host, "pid": row.pid, "device": row.device, "models": [], "busy": None},
        )
        if row.version:  # 0: a load error of a model.toml, not a version held
            child["models"].append(f"{row.name}:{row.version} {row.state}")
        if row.busy is not None:
            child["busy"] = (child["busy"] or 0.0) + row.busy
    return sorted(children.values(), key=lambda c: (c["host"], c["device"], c["pid"]))


@router.get("/v1/console/jobs/{job_id}", responses=error_responses(401, 403, 404, 422, 503))
async def job(job_id: JobId, request: Request) -> Response:
    """One job, any tenant's, for the console: as `GET /v1/jobs/{id}` shows it, outputs left
    out, with its timeline (created, each attempt started and how it ended, finished) and its
    outputs' dtypes and shapes. Admin keys only."""
    state = get_state(request)
    await state.auth.admin(request)

    def read() -> dict[str, Any]:
        with state.reads() as session:
            found = jobs.get(session=session, job_id=job_id)
            placed = standing.place(session=session, jobs=[found], recent=state.reader.recent)
            out = job_out(found, with_outputs=False, standing=placed.get(found.id))
            out["tenant"] = found.tenant
            out["samples"] = found.samples
            out["timeline"] = _timeline(found)
            shapes = None
            if found.status == JobStatus.SUCCEEDED.value and found.outputs is not None:
                shapes = _output_shapes(found.id, found.outputs)
            out["output_shapes"] = shapes
            return out

    return json_response(await run_in_threadpool(read))


def _output_shapes(job_id: str, blob: bytes) -> dict[str, dict[str, Any]]:
    """Each output's dtype and shape; one held in the object store also its URI (its bytes
    are not read for this)."""
    shapes: dict[str, dict[str, Any]] = {
        name: {"dtype": _dtype(array), "shape": list(array.shape)}
        for name, array in tensors.unpack(blob, inline_only=True).items()
    }
    for name, ref in tensors.references(blob).items():
        shapes[name] = {
            "dtype": ref.dtype,
            "shape": list(ref.shape),
            "uri": output_uri(job_id, name),
        }
    return shapes


def _dtype(array: Any) -> str:
    return tensors.STRING if tensors.is_string(array) else str(array.dtype.name)


def _timeline(job: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"at": iso_utc(job.created_at), "event": "created"}]
    for entry in jobs.history_of(job):
        events.append({"at": iso_utc(entry.at), "event": entry.event, "detail": entry.detail})
    if job.finished_at is not None:
        events.append({"at": iso_utc(job.finished_at), "event": job.status})
    return events
