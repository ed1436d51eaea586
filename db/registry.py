"""Registered model versions: the signatures the API validates submissions against, which
version a submission without one gets, and the fleet's view of every version.

A version without a number in the submission goes to the latest version that a live worker
child has loaded (and that is not retired); with no live worker, to the latest registered one
that is not retired (`tffleet models register` records versions before any worker runs).
`unregister` takes a model off the list once no live child holds it (`tffleet models unregister`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db import clock, jobs, presence
from db.models import Job, JobStatus, ModelPresence, ModelVersion, PresenceState
from tffleet.errors import Conflict, JobAlreadyFinished, ModelNotFound


def register(
    *,
    session: Session,
    name: str,
    version: int,
    format: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    config: dict[str, Any] | None = None,
) -> None:
    """Record (or refresh) a model version's signature, and take it out of retirement.

    Safe to race: it is an upsert.
    """
    values = {
        "name": name,
        "version": version,
        "format": format,
        "inputs": inputs,
        "outputs": outputs,
        "config": config or {},
        "registered_at": clock.now(session),
        "retired_at": None,
    }
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    stmt = insert(ModelVersion).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["name", "version"],
        set_={
            k: stmt.excluded[k]
            for k in ("format", "inputs", "outputs", "config", "registered_at", "retired_at")
        },
    )
    session.execute(stmt)


def retire(*, session: Session, name: str, version: int, at: datetime | None = None) -> bool:
    """Refuse new submissions naming this version from now on (a newer one replaced it).

    True if this call retired it; False if it was retired already or is not registered.
    """
    result = session.execute(
        update(ModelVersion)
        .where(
            ModelVersion.name == name,
            ModelVersion.version == version,
            ModelVersion.retired_at.is_(None),
        )
        .values(retired_at=at or clock.now(session))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def reinstate(*, session: Session, name: str, version: int) -> None:
    """Take a retired version back into service (a worker serves it again)."""
    session.execute(
        update(ModelVersion)
        .where(ModelVersion.name == name, ModelVersion.version == version)
        .values(retired_at=None)
    )


def _latest(registered: dict[int, bool], loaded: Iterable[int]) -> int | None:
    """The version a submission without one gets. `registered`: version -> retired."""
    live = [v for v in loaded if v in registered and not registered[v]]
    current = [v for v, retired in registered.items() if not retired]
    return max(live or current or registered, default=None)


def _loaded_versions(session: Session, name: str, live_since: datetime | None) -> set[int]:
    if live_since is None:
        return set()
    return set(
        session.scalars(
            select(ModelPresence.version).where(
                ModelPresence.name == name,
                ModelPresence.state == PresenceState.LOADED.value,
                ModelPresence.seen_at >= live_since,
            )
        )
    )


def resolve(
    *,
    session: Session,
    name: str,
    version: int | None = None,
    live_since: datetime | None = None,
) -> ModelVersion:
    """The named version, or the latest one when `version` is None (see the module docstring).

    `live_since`: children seen since then are live (`presence.live_since`); None: ignore
    which versions workers hold. A retired version named explicitly is refused.
    """
    registered = {
        v: retired_at is not None
        for v, retired_at in session.execute(
            select(ModelVersion.version, ModelVersion.retired_at).where(ModelVersion.name == name)
        )
    }
    if not registered:
        raise unknown_model(session, name)
    loaded = _loaded_versions(session, name, live_since)
    if version is None:
        version = _latest(registered, loaded)
    elif version not in registered:
        raise ModelNotFound(f"version: model {name!r} has no version {version}")
    elif registered[version]:
        serving = sorted(v for v in loaded if not registered.get(v, True)) or sorted(
            v for v, retired in registered.items() if not retired
        )
        raise ModelNotFound(
            f"version: model {name!r} version {version} is retired (a newer version replaced "
            f"it; its queued jobs still run); it takes new jobs on versions {serving}, or "
            f"leave out `version` for the latest"
        )
    # register() upserts with Core: re-read the row, not an object this session already holds.
    found = session.get(ModelVersion, (name, version), populate_existing=True)
    if found is None:  # deleted since the read above
        raise ModelNotFound(f"version: model {name!r} has no version {version}")
    return found


# How many model names a 404 for an unknown model lists: enough to spot a typo, bounded.
UNKNOWN_MODEL_NAMES = 10


def unknown_model(session: Session, name: str) -> ModelNotFound:
    """The 404 for a model not registered, naming those that are (sorted, the first
    UNKNOWN_MODEL_NAMES): a typo or a model not registered yet shows at a glance."""
    names = list(
        session.scalars(
            select(ModelVersion.name)
            .distinct()
            .order_by(ModelVersion.name)
            .limit(UNKNOWN_MODEL_NAMES + 1)
        )
    )
    known = ", ".join(names[:UNKNOWN_MODEL_NAMES]) + (
        ", ..." if len(names) > UNKNOWN_MODEL_NAMES else ""
    )
    there = f"models: {known}" if names else "no model is registered yet"
    return ModelNotFound(f"model: no model named {name!r} is registered; {there}")


def list_versions(*, session: Session) -> list[ModelVersion]:
    return list(
        session.scalars(select(ModelVersion).order_by(ModelVersion.name, ModelVersion.version))
    )


def versions_of(
    *, session: Session, name: str, live_since: datetime
) -> list[tuple[ModelVersion, bool]]:
    """A model's registered versions, oldest first, each with whether a live child has it
    loaded (a retired one included: it still runs its queued jobs)."""
    loaded = _loaded_versions(session, name, live_since)
    found = session.scalars(
        select(ModelVersion).where(ModelVersion.name == name).order_by(ModelVersion.version)
    )
    return [(m, m.version in loaded) for m in found]


@dataclass(frozen=True)
class VersionView:
    """One registered version as the fleet sees it."""

    model: ModelVersion
    holders: list[ModelPresence]  # live children that are loading, have loaded, or drain it
    queued: int
    running: int
    latest: bool  # where a submission without a version goes

    @property
    def retired(self) -> bool:
        return self.model.retired_at is not None

    @property
    def served(self) -> bool:
        """Some live child takes new jobs of it."""
        loaded = PresenceState.LOADED.value
        return not self.retired and any(h.state == loaded for h in self.holders)


@dataclass(frozen=True)
class Overview:
    versions: list[VersionView]
    load_errors: list[ModelPresence]  # live children's failed loads, registered or not
    live: list[ModelPresence]  # every live child's rows, as read for the above


def overview(
    *,
    session: Session,
    live_since: datetime,
    counts: Mapping[tuple[str, int], Mapping[str, int]] | None = None,
) -> Overview:
    """Every registered version with the live children holding it and its unfinished jobs
    (`counts`, where the caller has read them already: {(model, version): {status: count}})."""
    registered = list_versions(session=session)
    rows = presence.live(session=session, since=live_since)
    if counts is None:
        counts = jobs.count_unfinished(session=session)
    failed = PresenceState.FAILED.value
    holders: dict[tuple[str, int], list[ModelPresence]] = {}
    for row in rows:
        if row.state != failed:
            holders.setdefault((row.name, row.version), []).append(row)
    latest: dict[str, int | None] = {}
    for name in {m.name for m in registered}:
        latest[name] = _latest(
            {m.version: m.retired_at is not None for m in registered if m.name == name},
            [
                v
                for (n, v), held in holders.items()
                if n == name and any(h.state == PresenceState.LOADED.value for h in held)
            ],
        )
    views = []
    for m in registered:
        count = counts.get((m.name, m.version), {})
        views.append(
            VersionView(
                model=m,
                holders=holders.get((m.name, m.version), []),
                queued=count.get(JobStatus.QUEUED.value, 0),
                running=count.get(JobStatus.RUNNING.value, 0),
                latest=latest[m.name] == m.version,
            )
        )
    return Overview(
        versions=views, load_errors=[row for row in rows if row.state == failed], live=rows
    )


# ─── Unregister ───────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Unregistered:
    """What `unregister` did."""

    name: str
    versions: list[int]
    canceled: dict[str, int]  # {status it had: count} of the jobs it canceled
    presence: int  # rows deleted: dead children's, and load errors


def unregister(
    *,
    session: Session,
    name: str,
    live_since: datetime,
    version: int | None = None,
    cancel: bool = False,
) -> Unregistered:
    """Take a model (or one version) off the fleet's list: its registered versions go, so the
    API refuses new jobs of it; ended jobs of it stay readable.

    Refused (`Conflict`, nothing changed) while a live child holds it (it would go on serving
    it), or while jobs of it are queued or running, unless `cancel`: they are canceled here, as
    `POST /v1/jobs/{id}/cancel` does (webhooks, split jobs' parts), in the caller's transaction.
    """
    versions = _versions_to_unregister(session, name, version)
    _refuse_while_held(session, name, version, live_since)
    canceled = _cancel_unfinished(session, name, version, cancel)
    where = [ModelVersion.name == name, ModelVersion.version.in_(versions)]
    session.execute(delete(ModelVersion).where(*where))
    # What live children hold was refused above: the rest are dead children's and load errors.
    rows = [ModelPresence.name == name]
    if version is not None:
        rows.append(ModelPresence.version == version)
    removed = session.execute(delete(ModelPresence).where(*rows))
    return Unregistered(name, versions, canceled, int(removed.rowcount))  # type: ignore[attr-defined]


def _versions_to_unregister(session: Session, name: str, version: int | None) -> list[int]:
    # Locked: two unregisters (or a register) of one model wait for each other.
    registered = list(
        session.scalars(
            select(ModelVersion.version)
            .where(ModelVersion.name == name)
            .order_by(ModelVersion.version)
            .with_for_update()
        )
    )
    if not registered:
        raise unknown_model(session, name)
    if version is None:
        return registered
    if version not in registered:
        raise ModelNotFound(
            f"version: model {name!r} has no version {version}; its versions: {registered}"
        )
    return [version]


def _refuse_while_held(
    session: Session, name: str, version: int | None, live_since: datetime
) -> None:
    query = select(ModelPresence.host, ModelPresence.version, ModelPresence.state).where(
        ModelPresence.name == name,
        ModelPresence.seen_at >= live_since,
        ModelPresence.state != PresenceState.FAILED.value,
    )
    if version is not None:
        query = query.where(ModelPresence.version == version)
    held = session.execute(query.order_by(ModelPresence.host, ModelPresence.version)).all()
    if held:
        where = ", ".join(sorted({f"{name}:{v} ({s}) on {h}" for h, v, s in held}))
        raise Conflict(
            f"model: live worker children still hold {where}; remove {name} from the model "
            f"repository on every worker host and run `tffleet models reload` first"
        )


def _cancel_unfinished(
    session: Session, name: str, version: int | None, cancel: bool
) -> dict[str, int]:
    """Cancel the model's queued and running jobs (a split job's parts go with their job), or
    refuse while there are any."""
    query = select(Job.id, Job.status).where(
        Job.model == name,
        Job.parent_id.is_(None),
        Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value]),
    )
    if version is not None:
        query = query.where(Job.version == version)
    unfinished = session.execute(query.order_by(Job.id)).all()
    counts: dict[str, int] = {}
    for _, status in unfinished:
        counts[status] = counts.get(status, 0) + 1
    if not cancel:
        if unfinished:
            raise Conflict(
                f"model: {name} has {jobs_phrase(counts)}; pass --cancel to cancel them, "
                f"or wait until they end"
            )
        return counts
    canceled: dict[str, int] = {}
    for job_id, status in unfinished:
        try:
            jobs.cancel(session=session, job_id=job_id)
        except JobAlreadyFinished:
            continue  # it ended since the read above: nothing to cancel
        canceled[status] = canceled.get(status, 0) + 1
    return canceled


def jobs_phrase(counts: Mapping[str, int]) -> str:
    """'3 queued and 1 running jobs', as the CLI prints it too."""
    parts = [f"{counts[s]} {s}" for s in (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
             if counts.get(s)]  # fmt: skip
    total = sum(counts.values())
    return " and ".join(parts) + (" job" if total == 1 else " jobs")
