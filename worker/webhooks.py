"""The webhook deliverer: sends the outbox's due deliveries (db/webhooks.py), signed, at least once.

It runs in the sweeper process (`tffleet sweeper`), on a thread of its own with its own asyncio
loop and its own database connections, so a slow receiver never slows a sweep. Every sweeper
process runs one, the standby ones too: a delivery is leased before it is sent (a compare-and-
set, as a claim is), so two deliverers never send the same attempt at once, and one that dies
mid-send leaves a lease that expires, after which the delivery is sent again (at least once:
receivers drop repeats by `webhook-id`).

- At most `webhook_max_in_flight` attempts at once, and `webhook_max_in_flight_per_tenant` of
  one tenant: a tenant whose receiver never answers holds only its own slots.
- Each attempt: the body is built now (the job as GET shows it, at the event: db/views.py; a
  transform's end, event `transform`, the transform as GET shows it: db/transform_views.py), the
  host is resolved and every address checked again (TFFLEET_WEBHOOK_ALLOW_PRIVATE), and the
  request goes to the address that was checked (the Host header and TLS name stay the URL's),
  so a name that resolves elsewhere since the submit reaches nothing it must not. Redirects are
  not followed: only a 2xx is a delivery.
- A failed attempt (non-2xx, a 3xx included, a time-out, a refused connection, a forbidden
  address) is retried after a back-off that grows sixfold from `webhook_backoff_s` up to
  `webhook_max_backoff_s`, with full jitter (a random delay up to it), until
  `webhook_retry_s` after the event; then it is `given_up`. A delivery whose job was deleted
  first is given up at once. Both are logged and counted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import threading
import uuid
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
from prometheus_client import Counter as Metric
from sqlalchemy.orm import Session, sessionmaker

from db import clock, transform_control
from db import webhooks as outbox
from db.models import JobStatus
from db.transform_views import transform_out
from db.views import job_out
from tffleet import webhooks
from tffleet.settings import Settings

log = logging.getLogger(__name__)

DELIVERIES = Metric(
    "tffleet_webhook_deliveries_total",
    "Webhook delivery attempts by result: delivered (2xx), failed (retried later), given_up",
    ["result"],
)

# How often delivered and given-up rows past TFFLEET_RESULT_TTL_S are deleted, and how many a time.
PURGE_EVERY_S = 60.0
PURGE_ROWS = 1000
# A stopping deliverer waits this long for attempts in flight; the others' leases then expire.
STOP_GRACE_S = 5.0


def backoff_s(settings: Settings, attempts: int) -> float:
    """The delay before the next attempt after `attempts` failed ones: full jitter, a random
    delay up to 5 s, 30 s, 3 min, ... (from TFFLEET_WEBHOOK_BACKOFF_S), capped."""
    ceiling = min(
        settings.webhook_max_backoff_s, settings.webhook_backoff_s * 6 ** min(attempts - 1, 20)
    )
    return random.uniform(0, ceiling)


def body_of(delivery: Any, job: Any) -> bytes:
    """The job as GET /v1/jobs/{id} showed it (a tenant's view) at the delivery's event."""
    view = SimpleNamespace(**job._mapping)
    view.status = delivery.job_status
    view.attempts = delivery.job_attempts
    view.started_at = delivery.job_started_at
    view.finished_at = delivery.job_finished_at
    view.error_code = delivery.job_error_code
    view.error_message = delivery.job_error_message
    view.deadline_at = delivery.job_deadline_at
    view.worker = None  # which host ran it is for admins
    if delivery.job_status != JobStatus.SUCCEEDED.value:
        view.outputs = None
    return orjson.dumps(job_out(view), option=orjson.OPT_SERIALIZE_NUMPY)  # type: ignore[arg-type]


def transform_body(session: Session, delivery: Any, transform: Any) -> bytes:
    """The transform as GET /v1/transforms/{id} shows it, at its end (db/transform_views.py)."""
    view = SimpleNamespace(**transform._mapping)
    view.status = delivery.job_status
    view.started_at = delivery.job_started_at
    view.finished_at = delivery.job_finished_at
    running = transform_control.running(session=session, transform=view)  # type: ignore[arg-type]
    return orjson.dumps(transform_out(view, running=running))


class Deliverer:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: Settings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._transport = transport
        self.owner = f"{socket.gethostname()}/{os.getpid()}/webhooks/{uuid.uuid4().hex[:8]}"
        self._lease_s = settings.webhook_connect_timeout_s + settings.webhook_read_timeout_s + 30.0
        self._in_flight: Counter[str] = Counter()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="webhooks", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        """Deliver until `stop` is set; errors of the database are logged and retried."""
        asyncio.run(self._main(stop))

    async def _main(self, stop: threading.Event) -> None:
        settings = self._settings
        timeout = httpx.Timeout(
            settings.webhook_read_timeout_s, connect=settings.webhook_connect_timeout_s
        )
        limits = httpx.Limits(max_connections=settings.webhook_max_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        purged_at = 0.0
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(
            timeout=timeout,
            limits=limits,
            follow_redirects=False,
            transport=self._transport,
            trust_env=False,
        ) as client:
            while not stop.is_set():
                try:
                    tasks |= await self._launch(client, len(tasks))
                    if loop.time() - purged_at > PURGE_EVERY_S:
                        purged_at = loop.time()
                        await asyncio.to_thread(self._purge)
                except Exception as exc:  # the database is away: try again next round
                    log.warning("webhook deliverer: %s: %s", type(exc).__name__, exc)
                if tasks:
                    _, tasks = await asyncio.wait(
                        tasks, timeout=settings.webhook_poll_s, return_when=asyncio.FIRST_COMPLETED
                    )
                else:
                    await asyncio.sleep(settings.webhook_poll_s)
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
                for task in pending:
                    task.cancel()

    async def _launch(self, client: httpx.AsyncClient, busy: int) -> set[asyncio.Task[None]]:
        room = self._settings.webhook_max_in_flight - busy
        if room <= 0:
            return set()
        cap = self._settings.webhook_max_in_flight_per_tenant
        tenant_room = {tenant: cap - n for tenant, n in self._in_flight.items()}
        due = await asyncio.to_thread(self._lease, room, tenant_room)
        started = set()
        for delivery in due:
            self._in_flight[delivery.tenant] += 1
            started.add(asyncio.create_task(self._deliver(client, delivery)))
        return started

    def _lease(self, room: int, tenant_room: dict[str, int]) -> list[outbox.Due]:
        with self._sessions.begin() as session:
            return outbox.lease(
                session=session,
                owner=self.owner,
                lease_s=self._lease_s,
                room=room,
                tenant_room=tenant_room,
                per_tenant=self._settings.webhook_max_in_flight_per_tenant,
            )

    def _purge(self) -> None:
        with self._sessions.begin() as session:
            older_than = clock.now(session) - timedelta(seconds=self._settings.result_ttl_s)
            outbox.purge(session=session, older_than=older_than, limit=PURGE_ROWS)

    # One attempt

    async def _deliver(self, client: httpx.AsyncClient, delivery: outbox.Due) -> None:
        try:
            await self._attempt(client, delivery)
        except Exception as exc:  # the database went away mid-attempt: its lease expires
            log.warning("webhook %s: %s: %s", delivery.id, type(exc).__name__, exc)
        finally:
            self._in_flight[delivery.tenant] -= 1
            if self._in_flight[delivery.tenant] <= 0:
                del self._in_flight[delivery.tenant]

    async def _attempt(self, client: httpx.AsyncClient, delivery: outbox.Due) -> None:
        built = await asyncio.to_thread(self._build, delivery)
        if built is None:
            await asyncio.to_thread(self._give_up, delivery, "its job was deleted first", None)
            return
        body, secret = built
        status: int | None = None
        try:
            request = await asyncio.to_thread(self._request, delivery, body, secret)
            response = await client.send(request)
            await response.aclose()
            status = response.status_code
            if 200 <= status < 300:
                await asyncio.to_thread(self._delivered, delivery, status)
                return
            error = f"HTTP {status}"
            if response.is_redirect:
                error += " (a redirect: not followed)"
        except (httpx.HTTPError, webhooks.WebhookAddressError) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        await asyncio.to_thread(self._failed, delivery, error, status)

    def _build(self, delivery: outbox.Due) -> tuple[bytes, str] | None:
        with self._sessions() as session:
            found = outbox.snapshot(session=session, delivery_id=delivery.id)
            if found is None:
                return None
            if delivery.event == outbox.TRANSFORM_EVENT:
                body = transform_body(session, *found)
            else:
                body = body_of(*found)
            secret = outbox.secret(session=session, tenant=delivery.tenant)
        return body, secret

    def _request(self, delivery: outbox.Due, body: bytes, secret: str) -> httpx.Request:
        """The POST, to the address just checked (resolved now, on this thread)."""
        addresses = webhooks.check(delivery.url, allow_private=self._settings.webhook_allow_private)
        url = httpx.URL(delivery.url)
        headers = webhooks.headers(secret, delivery.id, body)
        headers["host"] = url.netloc.decode("ascii")
        headers["user-agent"] = "tffleet-webhooks"
        extensions: dict[str, Any] = {}
        if url.scheme == "https":
            extensions["sni_hostname"] = url.host  # the certificate is checked against it
        return httpx.Request(
            "POST",
            url.copy_with(host=addresses[0]),
            content=body,
            headers=headers,
            extensions=extensions,
        )

    def _delivered(self, delivery: outbox.Due, status: int) -> None:
        with self._sessions.begin() as session:
            outbox.delivered(
                session=session, delivery_id=delivery.id, owner=self.owner, http_status=status
            )
        DELIVERIES.labels("delivered").inc()

    def _failed(self, delivery: outbox.Due, error: str, status: int | None) -> None:
        attempts = delivery.attempts + 1
        delay = backoff_s(self._settings, attempts)
        with self._sessions.begin() as session:
            now = clock.now(session)
            retry_until = delivery.created_at + timedelta(seconds=self._settings.webhook_retry_s)
            if now + timedelta(seconds=delay) > retry_until:
                gave_up = outbox.give_up(
                    session=session,
                    delivery_id=delivery.id,
                    owner=self.owner,
                    error=error,
                    http_status=status,
                )
            else:
                gave_up = False
                outbox.retry_at(
                    session=session,
                    delivery_id=delivery.id,
                    owner=self.owner,
                    delay_s=delay,
                    error=error,
                    http_status=status,
                )
        if gave_up:
            DELIVERIES.labels("given_up").inc()
            log.warning(
                "webhook %s (%s of job %s) given up after %d attempts: %s",
                delivery.id,
                delivery.event,
                delivery.job_id,
                attempts,
                error,
            )
        else:
            DELIVERIES.labels("failed").inc()
            log.info(
                "webhook %s attempt %d failed (%s); next in %.1fs",
                delivery.id,
                attempts,
                error,
                delay,
            )

    def _give_up(self, delivery: outbox.Due, error: str, status: int | None) -> None:
        with self._sessions.begin() as session:
            outbox.give_up(
                session=session,
                delivery_id=delivery.id,
                owner=self.owner,
                error=error,
                http_status=status,
                attempted=False,
            )
        DELIVERIES.labels("given_up").inc()
        log.warning(
            "webhook %s (%s of job %s) given up: %s",
            delivery.id,
            delivery.event,
            delivery.job_id,
            error,
        )
