"""The webhook outbox (db/webhooks.py): a delivery row in the transaction of each change of a job
that asked for it, on SQLite and PostgreSQL; the deliverer's leases; tenants' secrets."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from db import cache, clock, jobs, parts, tenants, webhooks
from db.models import DEFAULT_TENANT, DeliveryStatus, Job, JobErrorCode, WebhookDelivery
from tffleet import tensors

Sessions = sessionmaker[Session]
URL = "https://hooks.example.com/tffleet"
BOTH = webhooks.bits(["start", "completed"])


def make(
    sessions: Sessions,
    count: int = 1,
    *,
    events: int | None = BOTH,
    tenant: str = DEFAULT_TENANT,
    **extra: Any,
) -> list[str]:
    new = [
        jobs.NewJob(
            model="m",
            version=1,
            samples=1,
            inputs=tensors.pack({"x": np.zeros((1, 2), np.float32)}),
            tenant=tenant,
            webhook=URL if events else None,
            webhook_events=events,
            **extra,
        )
        for _ in range(count)
    ]
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=tenant)
        return [job.id for job in jobs.create(session=session, jobs=new)]


def deliveries(sessions: Sessions, job_id: str | None = None) -> list[WebhookDelivery]:
    with sessions() as session:
        query = select(WebhookDelivery).order_by(WebhookDelivery.created_at)
        if job_id is not None:
            query = query.where(WebhookDelivery.job_id == job_id)
        return list(session.scalars(query))


def claim(sessions: Sessions, job_ids: list[str], owner: str = "w") -> list[jobs.Lease]:
    with sessions.begin() as session:
        return jobs.claim(session=session, job_ids=job_ids, owner=owner, lease_s=60)


def test_a_job_without_a_webhook_leaves_no_delivery(sessions: Sessions) -> None:
    (job_id,) = make(sessions, events=None)
    (lease,) = claim(sessions, [job_id])
    assert lease.webhook_events is None
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, b"out")])
    assert deliveries(sessions) == []


def test_start_then_completed_each_once_with_the_job_as_it_was(sessions: Sessions) -> None:
    (job_id,) = make(sessions)
    (lease,) = claim(sessions, [job_id])
    (start,) = deliveries(sessions, job_id)
    assert (start.event, start.status, start.url, start.attempts) == ("start", "pending", URL, 0)
    assert start.id.startswith("msg_") and start.job_status == "running"
    assert start.job_attempts == 1 and start.job_finished_at is None
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"out")]) == 1
    with sessions.begin() as session:  # a duplicate worker's late result: fenced out, no event
        assert jobs.complete(session=session, results=[(lease, b"out")]) == 0
    start_again, completed = deliveries(sessions, job_id)
    assert start_again.id == start.id
    assert (completed.event, completed.job_status) == ("completed", "succeeded")
    assert completed.job_finished_at is not None and completed.id != start.id


def test_only_the_events_asked_for(sessions: Sessions) -> None:
    (job_id,) = make(sessions, events=webhooks.bits(["completed"]))
    (lease,) = claim(sessions, [job_id])
    assert deliveries(sessions) == []
    with sessions.begin() as session:
        jobs.fail(session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="boom")
    (completed,) = deliveries(sessions)
    assert (completed.event, completed.job_status) == ("completed", "failed")
    assert completed.job_error_code == "model_error" and completed.job_error_message == "boom"


def test_cancel_and_deadline_and_worker_lost_each_record_completed(sessions: Sessions) -> None:
    canceled, overdue, lost = make(sessions, 3, events=webhooks.bits(["completed"]))
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=canceled)
        jobs.cancel(session=session, job_id=canceled)  # twice: one event
        session.execute(update(Job).where(Job.id == overdue).values(deadline_at=clock.now(session)))
    with sessions.begin() as session:
        assert jobs.cancel_overdue(session=session) == [overdue]
    claim(sessions, [lost])
    with sessions.begin() as session:
        later = clock.now(session) + timedelta(seconds=120)
        taken = jobs.expire_leases(session=session, now=later, max_attempts=1)
    assert taken.failed == [lost]
    found = {d.job_id: d for d in deliveries(sessions)}
    assert set(found) == {canceled, overdue, lost}
    assert found[canceled].job_status == "canceled"
    assert found[overdue].job_error_code == "deadline"
    assert found[lost].job_error_code == "worker_lost"
    assert {d.event for d in found.values()} == {"completed"}


def test_a_retried_job_starts_and_completes_again(sessions: Sessions) -> None:
    (job_id,) = make(sessions)
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        jobs.fail(session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="x")
    with sessions.begin() as session:
        jobs.retry(session=session, job_id=job_id)
    (lease,) = claim(sessions, [job_id])
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, b"out")])
    events = [(d.event, d.job_attempts) for d in deliveries(sessions, job_id)]
    assert events == [("start", 1), ("completed", 1), ("start", 2), ("completed", 2)]


def test_a_cache_hit_at_submit_records_completed(sessions: Sessions) -> None:
    with sessions.begin() as session:
        cache.remember(session=session, entries=[("k" * 64, b"cached")], now=clock.now(session))
    (job_id,) = make(sessions, cache_key="k" * 64)
    (completed,) = deliveries(sessions, job_id)
    assert (completed.event, completed.job_status) == ("completed", "succeeded")
    keyed = jobs.NewJob(
        model="m",
        version=1,
        samples=1,
        inputs=b"in",
        cache_key="k" * 64,
        idempotency_key="key-1",
        request_hash="h",
        webhook=URL,
        webhook_events=BOTH,
    )
    with sessions.begin() as session:
        (submitted,) = jobs.create_idempotent(session=session, requests=[[keyed]])
    with sessions.begin() as session:  # the replay records nothing more
        jobs.create_idempotent(session=session, requests=[[keyed]])
    assert isinstance(submitted, jobs.Submitted)
    assert [d.event for d in deliveries(sessions, submitted.jobs[0].id)] == ["completed"]


def test_a_split_job_completes_once_when_its_parts_settle(sessions: Sessions) -> None:
    (job_id,) = make(sessions, events=webhooks.bits(["completed"]))
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(samples=2))
    (lease,) = claim(sessions, [job_id])
    lease = jobs.Lease(**{**lease.__dict__, "samples": 2, "inputs": _two_samples()})
    with sessions.begin() as session:
        ids = parts.split(session=session, lease=lease, model="m", version=1, part_samples=1)
    part_leases = claim(sessions, ids)
    assert all(p.webhook_events is None for p in part_leases)
    out = tensors.pack({"y": np.zeros((1, 1), np.float32)})
    for part in part_leases:
        with sessions.begin() as session:
            jobs.complete(session=session, results=[(part, out)])
            parts.settle(session=session, parent_ids=[job_id])
    (completed,) = deliveries(sessions)
    assert (completed.job_id, completed.job_status) == (job_id, "succeeded")


def _two_samples() -> bytes:
    return tensors.pack({"x": np.zeros((2, 2), np.float32)})


def test_leases_share_the_slots_among_tenants(sessions: Sessions) -> None:
    for tenant in ("a", "b"):
        for job_id in make(sessions, 5, tenant=tenant, events=webhooks.bits(["completed"])):
            with sessions.begin() as session:
                jobs.cancel(session=session, job_id=job_id)

    def lease(owner: str, room: int = 10, **caps: int) -> list[webhooks.Due]:
        with sessions.begin() as session:
            return webhooks.lease(
                session=session,
                owner=owner,
                lease_s=60,
                room=room,
                tenant_room=caps,
                per_tenant=3,
            )

    first = lease("d1", a=1)
    assert sorted(d.tenant for d in first) == ["a", "b", "b", "b"]
    second = lease("d2")  # another deliverer: never a row the first holds
    assert not {d.id for d in first} & {d.id for d in second}
    assert sorted(d.tenant for d in second) == ["a", "a", "a", "b", "b"]
    (last,) = lease("d3")
    assert last.tenant == "a" and lease("d4") == []
    with sessions.begin() as session:
        assert webhooks.delivered(
            session=session, delivery_id=first[0].id, owner="d1", http_status=204
        )
        # A lease that is not held writes nothing.
        assert not webhooks.delivered(
            session=session, delivery_id=second[0].id, owner="d1", http_status=204
        )
        assert webhooks.retry_at(
            session=session,
            delivery_id=second[0].id,
            owner="d2",
            delay_s=0,
            error="HTTP 503",
            http_status=503,
        )
    (again,) = lease("d4")
    assert (again.id, again.attempts) == (second[0].id, 1)
    with sessions.begin() as session:
        assert webhooks.count(session=session, status=DeliveryStatus.DELIVERED) == 1


def test_a_tenants_secret_is_made_once(sessions: Sessions) -> None:
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name="other")
    with sessions() as session:
        first = webhooks.secret(session=session, tenant=DEFAULT_TENANT)
        assert webhooks.secret(session=session, tenant=DEFAULT_TENANT) == first
        other = webhooks.secret(session=session, tenant="other")
    assert first.startswith("whsec_") and other.startswith("whsec_") and first != other


def test_recording_reads_jobs_by_an_index(sessions: Sessions) -> None:
    """The outbox's INSERT ... SELECT finds its jobs by an index (PostgreSQL's plan)."""
    with sessions() as session:
        if session.get_bind().dialect.name != "postgresql":
            pytest.skip("SQLite's planner is not the one that matters")
        # The test's table is small, which PostgreSQL would read whole: forbid that, to see the
        # index it takes on a large one.
        session.execute(text("SET LOCAL enable_seqscan = off"))
        statement = webhooks.record_statement("postgresql", webhooks.Event.COMPLETED)
        params = {"w_ids": ["00000000-0000-7000-8000-000000000000"], "w_at": clock.now(session)}
        connection = session.connection()
        plans: list[str] = []

        def explain(conn: Any, cursor: Any, sql: str, parameters: Any, *_: Any) -> Any:
            return "EXPLAIN " + sql, parameters

        def read(conn: Any, cursor: Any, *_: Any) -> None:
            plans.extend(row[0] for row in cursor.fetchall())

        event.listen(connection, "before_cursor_execute", explain, retval=True)
        event.listen(connection, "after_cursor_execute", read)
        try:
            session.execute(statement, params)
        finally:
            event.remove(connection, "before_cursor_execute", explain)
            event.remove(connection, "after_cursor_execute", read)
        plan = "\n".join(plans)
    # By its primary key, or by `finished_at` (equal to the one bound): one row either way.
    assert "Index Scan" in plan and "Seq Scan" not in plan, plan
