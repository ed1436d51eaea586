"""The webhook deliverer (worker/webhooks.py) against real receivers on both database backends:
signed bodies, retries under one webhook-id, giving up, redirects, the address check again at
delivery, and one tenant's dead receiver beside another's live one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import standardwebhooks
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, tenants, webhooks
from db.models import DEFAULT_TENANT, Job, JobErrorCode, WebhookDelivery
from db.views import job_out
from tests.receivers import Receiver, black_hole
from tffleet import tensors
from tffleet.settings import Settings
from worker.webhooks import Deliverer, backoff_s

pytestmark = pytest.mark.both_databases

Sessions = sessionmaker[Session]
BOTH = webhooks.bits(["start", "completed"])
OUT = {"y": np.array([[0.5, -1.25]], dtype=np.float32)}


@pytest.fixture
def settings(db_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        broker_url=redis_url,
        webhook_allow_private=True,
        webhook_backoff_s=0.05,
        webhook_poll_s=0.05,
        webhook_connect_timeout_s=1,
        webhook_read_timeout_s=2,
    )


Start = Callable[..., Deliverer]


@pytest.fixture
def deliver(sessions: Sessions, settings: Settings) -> Iterator[Start]:
    """Start a deliverer on its thread (settings overridable); stopped after the test."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(**overrides: Any) -> Deliverer:
        deliverer = Deliverer(sessions, settings.model_copy(update=overrides))
        threads.append(deliverer.start(stop))
        return deliverer

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive()


def submit(sessions: Sessions, url: str, events: int = BOTH, tenant: str = DEFAULT_TENANT) -> str:
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=tenant)
        new = jobs.NewJob(
            model="m",
            version=1,
            samples=1,
            inputs=b"in",
            tenant=tenant,
            webhook=url,
            webhook_events=events,
        )
        return jobs.create(session=session, jobs=[new])[0].id


def run(sessions: Sessions, job_id: str) -> None:
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, tensors.pack(OUT))])


def rows(sessions: Sessions) -> list[WebhookDelivery]:
    with sessions() as session:
        return list(session.scalars(select(WebhookDelivery).order_by(WebhookDelivery.event)))


def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_retried_until_accepted_under_one_id_and_signed(sessions: Sessions, deliver: Start) -> None:
    with Receiver(script=[503, 503, 503, 503]) as receiver:
        job_id = submit(sessions, receiver.url)
        run(sessions, job_id)
        deliver()
        got = receiver.wait_for(2)
    with sessions() as session:
        secret = webhooks.secret(session=session, tenant=DEFAULT_TENANT)
        job = jobs.get(session=session, job_id=job_id)
        _ = job.outputs
    by_event: dict[str, list[Any]] = {}
    for hit in receiver.received:
        body = standardwebhooks.Webhook(secret).verify(hit.body, hit.headers)
        by_event.setdefault(body["status"], []).append(hit)
    assert len(got) == 2 and len(receiver.received) == 6
    for hits in by_event.values():  # one id per event, on every attempt
        assert len({hit.headers["webhook-id"] for hit in hits}) == 1
    started, completed = (hit.json for hit in got)
    if started["status"] != "running":
        started, completed = completed, started
    expected = job_out(job)
    expected["worker"] = None
    assert completed == expected
    assert completed["outputs"] == {"y": [[0.5, -1.25]]}
    # The start as the job was when it started: running, no outputs, no end.
    assert started | {"status": "succeeded"} == expected | {
        "outputs": None,
        "finished_at": None,
        "usage": None,
    }
    until(lambda: all(row.status == "delivered" for row in rows(sessions)))
    delivered = rows(sessions)
    assert sum(row.attempts for row in delivered) == 6
    assert {row.last_status for row in delivered} == {200}


def test_a_deleted_job_and_a_dead_receiver_are_given_up(sessions: Sessions, deliver: Start) -> None:
    with Receiver(then=500) as receiver:
        deleted = submit(sessions, receiver.url, events=webhooks.Event.COMPLETED)
        kept = submit(sessions, receiver.url, events=webhooks.Event.COMPLETED)
        with sessions.begin() as session:
            jobs.cancel(session=session, job_id=deleted)
            jobs.cancel(session=session, job_id=kept)
        with sessions.begin() as session:
            jobs.remove(session=session, job_id=deleted)
        deliver(webhook_retry_s=0.5)
        until(lambda: all(row.status == "given_up" for row in rows(sessions)))
    found = {row.job_id: row for row in rows(sessions)}
    assert found[deleted].attempts == 0 and "deleted" in (found[deleted].last_error or "")
    assert found[kept].attempts >= 1 and found[kept].last_status == 500
    assert all(hit.json["id"] == kept for hit in receiver.received)


def test_a_redirect_is_a_failed_attempt_and_never_followed(
    sessions: Sessions, deliver: Start
) -> None:
    with Receiver(script=[302], then=200) as receiver:
        job_id = submit(sessions, receiver.url, events=webhooks.Event.COMPLETED)
        with sessions.begin() as session:
            jobs.fail(
                session=session,
                leases=jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60),
                code=JobErrorCode.MODEL_ERROR,
                message="boom",
            )
        deliver()
        (got,) = receiver.wait_for(1)
    assert [hit.path for hit in receiver.received] == ["/hook", "/hook"]
    assert got.json["error"] == {"code": "model_error", "message": "boom"}
    assert got.json["outputs"] is None


def test_a_private_address_is_refused_again_at_delivery(sessions: Sessions, deliver: Start) -> None:
    with Receiver() as receiver:
        submit(sessions, receiver.url, events=webhooks.Event.COMPLETED)
        with sessions.begin() as session:
            (job,) = session.scalars(select(Job)).all()
            jobs.cancel(session=session, job_id=job.id)
        deliver(webhook_allow_private=False)
        until(lambda: rows(sessions)[0].attempts >= 1)
    assert receiver.received == []
    assert "loopback" in (rows(sessions)[0].last_error or "")


def test_a_dead_receiver_holds_only_its_tenants_slots(sessions: Sessions, deliver: Start) -> None:
    with black_hole() as dead, Receiver() as live:
        for _ in range(6):
            job_id = submit(sessions, dead, events=webhooks.Event.COMPLETED, tenant="dead")
            with sessions.begin() as session:
                jobs.cancel(session=session, job_id=job_id)
        deliver(webhook_max_in_flight=4, webhook_max_in_flight_per_tenant=2)
        time.sleep(0.3)  # the dead tenant's attempts are in flight, hanging
        job_id = submit(sessions, live.url, events=webhooks.Event.COMPLETED, tenant="live")
        started = time.monotonic()
        with sessions.begin() as session:
            jobs.cancel(session=session, job_id=job_id)
        (got,) = live.wait_for(1, timeout_s=5)
    assert got.at - started < 1.0
    assert got.json["id"] == job_id


def test_two_deliverers_send_each_delivery_once(sessions: Sessions, deliver: Start) -> None:
    with Receiver() as receiver:
        for _ in range(40):
            job_id = submit(sessions, receiver.url, events=webhooks.Event.COMPLETED)
            with sessions.begin() as session:
                jobs.cancel(session=session, job_id=job_id)
        deliver()
        deliver()
        receiver.wait_for(40)
        time.sleep(0.5)
    ids = [hit.headers["webhook-id"] for hit in receiver.received]
    assert len(ids) == len(set(ids)) == 40


def test_the_back_off_grows_with_full_jitter() -> None:
    settings = Settings(webhook_backoff_s=5, webhook_max_backoff_s=3600)
    ceilings = [5, 30, 180, 1080, 3600, 3600]
    for attempts, ceiling in enumerate(ceilings, start=1):
        delays = [backoff_s(settings, attempts) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2
