"""Webhooks, the database's side: the outbox of deliveries, and each tenant's signing secret.

A job that asked for a webhook (`jobs.webhook`, `jobs.webhook_events`) gets a delivery row for
each event it asked for, written by `record` in the transaction that changed the job, so an
event is never lost and never invented (a rolled-back change leaves none):

- `start`: a claim moved it to `running`, once per run attempt (a job taken back after its worker
  died and claimed again starts again; a claim undone at a worker's drain still sent its start);
- `completed`: it ended, whichever way (succeeded, also from the response cache at submit;
  failed; canceled, also past its deadline; `worker_lost`; a split job when its parts settle).

`record` is one INSERT ... SELECT from `jobs` by primary key, and only runs for jobs the caller
knows asked for the event (the `webhook_events` it holds already: a claim's RETURNING, a lease):
a fleet without webhooks pays nothing. The job's small fields at the event are copied beside
it, so a `start` delivered late still shows the job as it started; the body is built at delivery
(worker/webhooks.py), outputs from the job's row (a succeeded job's never change).

The deliverer `lease`s due rows (a compare-and-set, as a claim is), sends them, and records the
outcome (`delivered`, `retry_at`, `give_up`), fenced by its lease.
"""

from __future__ import annotations

import base64
import enum
import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Table,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db import clock
from db.models import (
    FINISHED,
    DeliveryStatus,
    Job,
    JobStatus,
    Tenant,
    Transform,
    WebhookDelivery,
)

_jobs: Table = Job.__table__  # type: ignore[assignment]
_deliveries: Table = WebhookDelivery.__table__  # type: ignore[assignment]
_tenants: Table = Tenant.__table__  # type: ignore[assignment]
_transforms: Table = Transform.__table__  # type: ignore[assignment]


class Event(enum.IntFlag):
    """The events a job may ask for; `jobs.webhook_events` holds their bits."""

    START = 1  # a claim moved it to running (each run attempt)
    COMPLETED = 2  # it ended: succeeded, failed or canceled

    @property
    def label(self) -> str:
        return {Event.START: "start", Event.COMPLETED: "completed"}[self]


EVENT_NAMES = {"start": Event.START, "completed": Event.COMPLETED}
DEFAULT_EVENTS = Event.COMPLETED


def bits(names: Sequence[str]) -> int:
    """`webhook_events` of event names (`start`, `completed`)."""
    value = 0
    for name in names:
        value |= EVENT_NAMES[name]
    return value


def wants(webhook_events: int | None, event: Event) -> bool:
    return bool(webhook_events and webhook_events & event)


# ─── The outbox ───────────────────────────────────────────────────────────────────────────────────


def _new_id(dialect: str) -> Any:
    """A random `msg_...` id made by the database, one per row of an INSERT ... SELECT."""
    if dialect == "postgresql":
        return literal_column("'msg_' || replace(gen_random_uuid()::text, '-', '')")
    return literal_column("'msg_' || lower(hex(randomblob(16)))")


def record(*, session: Session, event: Event, job_ids: Sequence[str], at: datetime) -> None:
    """Queue `event` for those of `job_ids` that asked for it and are in its state as of `at`
    (started, or ended, at `at`: the change this transaction just made, not another one's).

    Call it only with jobs known to want the event (`wants`); it costs one statement, by
    primary key. A second call for the same event changes nothing (unique job, event, time)."""
    if job_ids:
        statement = record_statement(session.get_bind().dialect.name, event)
        session.execute(statement, {"w_ids": list(job_ids), "w_at": at})


@functools.cache
def record_statement(dialect: str, event: Event) -> Any:
    """`record`'s INSERT ... SELECT ... ON CONFLICT DO NOTHING, of the job ids bound as `w_ids`
    and the time as `w_at`. Built once: building costs more than running it."""
    at = bindparam("w_at", type_=WebhookDelivery.at.type)
    if event is Event.START:
        happened = [_jobs.c.status == JobStatus.RUNNING.value, _jobs.c.started_at == at]
    else:
        finished = [status.value for status in FINISHED]
        happened = [_jobs.c.status.in_(finished), _jobs.c.finished_at == at]
    columns = {
        "id": _new_id(dialect),
        "job_id": _jobs.c.id,
        "tenant": _jobs.c.tenant,
        "event": literal(event.label),
        "url": _jobs.c.webhook,
        "status": literal(DeliveryStatus.PENDING.value),
        "attempts": literal(0),
        "next_attempt_at": at,
        "created_at": at,
        "at": at,
        "job_status": _jobs.c.status,
        "job_attempts": _jobs.c.attempts,
        "job_started_at": _jobs.c.started_at,
        "job_finished_at": _jobs.c.finished_at,
        "job_error_code": _jobs.c.error_code,
        "job_error_message": _jobs.c.error_message,
        "job_deadline_at": _jobs.c.deadline_at,
    }
    query = select(*(expr.label(name) for name, expr in columns.items())).where(
        _jobs.c.id.in_(bindparam("w_ids", expanding=True)),
        _jobs.c.webhook_events.op("&")(int(event)) != 0,
        *happened,
    )
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    return (
        insert(_deliveries)
        .from_select(list(columns), query)
        .on_conflict_do_nothing(index_elements=["job_id", "event", "at"])
    )


# A transform's end (db/transforms.py), asked for as a job's `completed`: its row's `job_id` is
# the transform's id, and its body the transform as GET /v1/transforms/{id} shows it.
TRANSFORM_EVENT = "transform"


def record_transform(*, session: Session, transform_id: str, at: datetime) -> None:
    """Queue the end of a transform that asked for `completed` and ended at `at`."""
    t = _transforms.c
    query = select(
        literal("msg_" + secrets.token_hex(16)),
        t.id,
        t.tenant,
        literal(TRANSFORM_EVENT),
        t.webhook,
        literal(DeliveryStatus.PENDING.value),
        literal(0),
        literal(at, WebhookDelivery.at.type),
        literal(at, WebhookDelivery.at.type),
        literal(at, WebhookDelivery.at.type),
        t.status,
        literal(0),
        t.started_at,
        t.finished_at,
    ).where(t.id == transform_id, t.webhook.is_not(None), t.finished_at == at)
    names = "id job_id tenant event url status attempts next_attempt_at created_at at job_status"
    names += " job_attempts job_started_at job_finished_at"
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(
        insert(_deliveries)
        .from_select(names.split(), query)
        .on_conflict_do_nothing(index_elements=["job_id", "event", "at"])
    )


# ─── The deliverer's side ─────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Due:
    """A delivery leased to be sent now."""

    id: str
    job_id: str
    tenant: str
    event: str
    url: str
    attempts: int  # attempts made before this one
    created_at: datetime


def _due(now: datetime) -> list[Any]:
    return [
        _deliveries.c.status == DeliveryStatus.PENDING.value,
        _deliveries.c.next_attempt_at <= now,
        or_(_deliveries.c.lease_expires_at.is_(None), _deliveries.c.lease_expires_at < now),
    ]


def lease(
    *,
    session: Session,
    owner: str,
    lease_s: float,
    room: int,
    tenant_room: dict[str, int],
    per_tenant: int,
) -> list[Due]:
    """Lease up to `room` due deliveries, at most `tenant_room[t]` (else `per_tenant`) of
    tenant t: the tenants with due rows each get theirs, so one tenant's backlog of a dead
    receiver never crowds out another's. A compare-and-set: of two deliverers, one wins a row."""
    now = clock.now(session)
    tenants = list(
        session.scalars(
            select(_deliveries.c.tenant).where(*_due(now)).group_by(_deliveries.c.tenant)
        )
    )
    chosen: list[str] = []
    for tenant in tenants:
        take = min(tenant_room.get(tenant, per_tenant), room - len(chosen))
        if take <= 0:
            continue
        chosen += session.scalars(
            select(_deliveries.c.id)
            .where(_deliveries.c.tenant == tenant, *_due(now))
            .order_by(_deliveries.c.next_attempt_at)
            .limit(take)
            # Rows another deliverer is leasing right now: left to it, not waited for.
            .with_for_update(skip_locked=True)
        ).all()
    if not chosen:
        return []
    rows = session.execute(
        update(_deliveries)
        .where(_deliveries.c.id.in_(chosen), *_due(now))
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(
            _deliveries.c.id,
            _deliveries.c.job_id,
            _deliveries.c.tenant,
            _deliveries.c.event,
            _deliveries.c.url,
            _deliveries.c.attempts,
            _deliveries.c.created_at,
        )
    ).all()
    return [Due(**row._asdict()) for row in rows]


def _fenced(delivery_id: str, owner: str) -> list[Any]:
    return [
        _deliveries.c.id == delivery_id,
        _deliveries.c.lease_owner == owner,
        _deliveries.c.status == DeliveryStatus.PENDING.value,
    ]


_RELEASED = {"lease_owner": None, "lease_expires_at": None}


def delivered(*, session: Session, delivery_id: str, owner: str, http_status: int) -> bool:
    now = clock.now(session)
    result = session.execute(
        update(_deliveries)
        .where(*_fenced(delivery_id, owner))
        .values(
            status=DeliveryStatus.DELIVERED.value,
            attempts=_deliveries.c.attempts + 1,
            last_status=http_status,
            last_error=None,
            delivered_at=now,
            **_RELEASED,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def retry_at(
    *,
    session: Session,
    delivery_id: str,
    owner: str,
    delay_s: float,
    error: str,
    http_status: int | None,
) -> bool:
    now = clock.now(session)
    result = session.execute(
        update(_deliveries)
        .where(*_fenced(delivery_id, owner))
        .values(
            attempts=_deliveries.c.attempts + 1,
            next_attempt_at=now + timedelta(seconds=delay_s),
            last_status=http_status,
            last_error=error[:2000],
            **_RELEASED,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def give_up(
    *,
    session: Session,
    delivery_id: str,
    owner: str,
    error: str,
    http_status: int | None,
    attempted: bool = True,
) -> bool:
    result = session.execute(
        update(_deliveries)
        .where(*_fenced(delivery_id, owner))
        .values(
            status=DeliveryStatus.GIVEN_UP.value,
            attempts=_deliveries.c.attempts + (1 if attempted else 0),
            last_status=http_status,
            last_error=error[:2000],
            **_RELEASED,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def snapshot(*, session: Session, delivery_id: str) -> tuple[Any, Any] | None:
    """The delivery's row and its job's row (outputs included), or its transform's for a
    transform's event; None where that is gone."""
    delivery = session.execute(
        select(_deliveries).where(_deliveries.c.id == delivery_id)
    ).one_or_none()
    if delivery is None:
        return None
    table = _transforms if delivery.event == TRANSFORM_EVENT else _jobs
    job = session.execute(select(table).where(table.c.id == delivery.job_id)).one_or_none()
    if job is None:
        return None
    return delivery, job


def purge(*, session: Session, older_than: datetime, limit: int) -> int:
    """Delete at most `limit` delivered or given-up rows made before `older_than`."""
    ids = list(
        session.scalars(
            select(_deliveries.c.id)
            .where(
                _deliveries.c.status != DeliveryStatus.PENDING.value,
                _deliveries.c.created_at < older_than,
            )
            .limit(limit)
        )
    )
    if not ids:
        return 0
    result = session.execute(delete(_deliveries).where(_deliveries.c.id.in_(ids)))
    return int(result.rowcount)  # type: ignore[attr-defined]


def count(*, session: Session, status: DeliveryStatus) -> int:
    query = (
        select(func.count()).select_from(_deliveries).where(_deliveries.c.status == status.value)
    )
    return int(session.scalar(query) or 0)


# ─── Secrets ──────────────────────────────────────────────────────────────────────────────────────

SECRET_PREFIX = "whsec_"


def secret(*, session: Session, tenant: str) -> str:
    """The tenant's signing secret, `whsec_` and base64 of 32 random bytes, made on first use
    (two racing requests both end with the one stored first). Commits when it makes one."""
    found = session.scalar(select(_tenants.c.webhook_secret).where(_tenants.c.name == tenant))
    if found:
        return found
    made = SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
    session.execute(
        update(_tenants)
        .where(_tenants.c.name == tenant, _tenants.c.webhook_secret.is_(None))
        .values(webhook_secret=made)
    )
    session.commit()
    stored = session.scalar(select(_tenants.c.webhook_secret).where(_tenants.c.name == tenant))
    if not stored:
        raise LookupError(f"tenant {tenant!r} not found")
    return stored
