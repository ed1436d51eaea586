"""GET /v1/jobs/{id}/events: the job's changes of status as server-sent events.

The in-process client (httpx over ASGITransport) hands back a streamed answer once it is whole,
which an event stream is when its job has ended; a client that goes away mid-stream is played by
driving the app's ASGI interface by hand.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from api.routes import events
from db import jobs, tenants
from db.models import DEFAULT_TENANT, JobErrorCode
from tests.api.conftest import Api, OpenApi, _until_subscribed, finish_job
from tffleet import tensors
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.settings import Settings

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]
FinishLater = Callable[..., Any]

ROW = [1.0, 2.0, 3.0, 4.0]
OUTPUTS = {"y": np.array([[0.5, -1.25, 3.0]], dtype=np.float32)}


async def submit(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json={"model": "mlp", "inputs": [ROW]})
    assert response.status_code == 202, response.text
    job: dict[str, Any] = response.json()
    return job


def parse(body: str) -> list[dict[str, str]]:
    """The events of a stream, each its fields (comments under ":")."""
    found = []
    for block in body.split("\n\n"):
        if not block:
            continue
        event: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            event[name or ":"] = value.removeprefix(" ")
        found.append(event)
    return found


def statuses(body: str) -> list[dict[str, str]]:
    return [e for e in parse(body) if e.get("event") == "status"]


def claim(sessions: Sessions, job_id: str) -> jobs.Lease:
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="test-worker", lease_s=60)
    return lease


async def test_the_stream_sends_queued_then_succeeded_with_outputs_and_ends(
    api: Api, finish_later: FinishLater, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No re-reads in this test's time: the end can only come from the announcement.
    monkeypatch.setattr(events, "QUEUED_RECHECK_S", 30.0)
    api.state.waiter.recheck_s = 30.0
    job = await submit(api.client)
    started = time.monotonic()
    queued_sent = once_sent(monkeypatch, b"queued.0")
    finish_later(job["id"], OUTPUTS, delay_s=0.1, announce_to=redis_url, after=queued_sent)

    response = await api.client.get(f"/v1/jobs/{job['id']}/events")

    assert time.monotonic() - started < 2.0
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    sent = statuses(response.text)
    assert [e["id"] for e in sent] == ["queued.0", "succeeded.1"]
    first = orjson.loads(sent[0]["data"])
    assert (first["id"], first["status"], first["outputs"]) == (job["id"], "queued", None)
    last = orjson.loads(sent[1]["data"])
    assert last["status"] == "succeeded" and last["outputs"] == {"y": OUTPUTS["y"].tolist()}
    # The last event's data is the job exactly as GET answers it.
    assert last == (await api.client.get(f"/v1/jobs/{job['id']}")).json()
    assert parse(response.text)[0] == {"retry": str(events.RETRY_MS)}


async def test_the_stream_sends_running_when_a_worker_claims_the_job(
    api: Api, sessions: Sessions, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "QUEUED_RECHECK_S", 0.1)
    job = await submit(api.client)
    queued, running = once_sent(monkeypatch, b"queued.0"), once_sent(monkeypatch, b"running.1")

    def worker() -> None:  # each step once the stream has shown the one before
        if not queued.wait(timeout=30):
            return
        lease = claim(sessions, job["id"])
        if not running.wait(timeout=30):
            return
        with sessions.begin() as session:
            jobs.fail(
                session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="boom"
            )
        with redis.Redis.from_url(redis_url) as client:
            client.publish(JOBS_DONE_CHANNEL, orjson.dumps([job["id"]]))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    response = await api.client.get(f"/v1/jobs/{job['id']}/events", params={"encoding": "b64"})
    thread.join(timeout=10)

    sent = statuses(response.text)
    assert [e["id"] for e in sent] == ["queued.0", "running.1", "failed.1"]
    assert orjson.loads(sent[1]["data"])["started_at"] is not None
    assert orjson.loads(sent[2]["data"])["error"] == {"code": "model_error", "message": "boom"}


async def test_b64_encoding_sends_outputs_as_envelopes(api: Api, sessions: Sessions) -> None:
    job = await submit(api.client)
    finish_job(sessions, job["id"], OUTPUTS)

    response = await api.client.get(f"/v1/jobs/{job['id']}/events", params={"encoding": "b64"})

    (only,) = statuses(response.text)  # it had ended: one event, then the end
    assert only["id"] == "succeeded.1"
    assert orjson.loads(only["data"])["outputs"]["y"]["dtype"] == "float32"


def once_sent(monkeypatch: pytest.MonkeyPatch, marker: bytes) -> threading.Event:
    """Set once an event stream has sent a chunk holding `marker`: a test ends its job then,
    not on a timer (on a loaded machine the stream may not have begun when a timer fires)."""
    seen = threading.Event()
    stream = events._events

    async def watched(*args: Any, **kwargs: Any) -> Any:
        async for chunk in stream(*args, **kwargs):
            if marker in chunk:
                seen.set()
            yield chunk

    monkeypatch.setattr(events, "_events", watched)
    return seen


def complete_later(
    sessions: Sessions, lease: jobs.Lease, redis_url: str, *, after: threading.Event
) -> threading.Thread:
    """Complete a claimed job from another thread once `after` is set, and announce it."""

    def run() -> None:
        if not after.wait(timeout=30):
            return
        _until_subscribed(redis_url)
        with sessions.begin() as session:
            assert jobs.complete(session=session, results=[(lease, tensors.pack(OUTPUTS))]) == 1
        with redis.Redis.from_url(redis_url) as client:
            client.publish(JOBS_DONE_CHANNEL, orjson.dumps([lease.job_id]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_last_event_id_resumes_with_later_states_only(
    api: Api, sessions: Sessions, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await submit(api.client)
    url = f"/v1/jobs/{job['id']}/events"
    lease = claim(sessions, job["id"])
    thread = complete_later(sessions, lease, redis_url, after=once_sent(monkeypatch, b"running.1"))

    # Seen queued: from running on.
    response = await api.client.get(url, headers={"Last-Event-ID": "queued.0"})
    thread.join(timeout=10)
    assert [e["id"] for e in statuses(response.text)] == ["running.1", "succeeded.1"]

    # Seen running: only the end.
    response = await api.client.get(url, headers={"Last-Event-ID": "running.1"})
    assert [e["id"] for e in statuses(response.text)] == ["succeeded.1"]

    # Seen the end: 204, which tells an EventSource to stop reconnecting.
    response = await api.client.get(url, headers={"Last-Event-ID": "succeeded.1"})
    assert response.status_code == 204 and response.content == b""

    # An id this API never sent: the whole stream.
    response = await api.client.get(url, headers={"Last-Event-ID": "bogus"})
    assert [e["id"] for e in statuses(response.text)] == ["succeeded.1"]


async def test_the_end_of_an_earlier_run_resumes_a_retried_job_from_its_state(
    api: Api, sessions: Sessions
) -> None:
    job = await submit(api.client)
    with sessions.begin() as session:
        jobs.fail(
            session=session,
            leases=[claim_in(session, job["id"])],
            code=JobErrorCode.MODEL_ERROR,
            message="boom",
        )
    with sessions.begin() as session:
        jobs.retry(session=session, job_id=job["id"])
        jobs.cancel(session=session, job_id=job["id"])

    response = await api.client.get(
        f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": "failed.1"}
    )

    assert [e["id"] for e in statuses(response.text)] == ["canceled.1"]


def claim_in(session: Session, job_id: str) -> jobs.Lease:
    (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="test-worker", lease_s=60)
    return lease


async def test_the_stream_of_a_job_that_has_not_ended_closes_after_a_while_and_resumes(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "STREAM_MAX_S", 0.5)
    job = await submit(api.client)  # nobody runs it
    url = f"/v1/jobs/{job['id']}/events"
    started = time.monotonic()

    response = await api.client.get(url)

    assert time.monotonic() - started < 2.0
    assert [e["id"] for e in statuses(response.text)] == ["queued.0"]
    response = await api.client.get(url, headers={"Last-Event-ID": "queued.0"})
    assert response.status_code == 200 and statuses(response.text) == []
    assert api.state.waiter.watches == 0


async def test_another_tenants_job_is_404(api: Api) -> None:
    job = await submit(api.client)

    response = await api.client.get(f"/v1/jobs/{job['id']}/events", headers=api.key("other"))

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"
    assert api.state.waiter.watches == 0


async def test_an_unknown_job_is_404_and_no_key_is_401(api: Api) -> None:
    missing = "01890000-0000-7000-8000-000000000000"
    assert (await api.client.get(f"/v1/jobs/{missing}/events")).status_code == 404
    response = await api.client.get(
        f"/v1/jobs/{missing}/events", headers={"Authorization": "Bearer nope"}
    )
    assert response.status_code == 401


async def test_a_lost_announcement_delays_the_end_but_never_hangs_the_stream(
    api: Api, finish_later: FinishLater
) -> None:
    api.state.waiter.recheck_s = 0.3
    job = await submit(api.client)
    finish_later(job["id"], OUTPUTS, delay_s=0.2)  # never announced

    response = await asyncio.wait_for(api.client.get(f"/v1/jobs/{job['id']}/events"), 5)

    assert statuses(response.text)[-1]["id"] == "succeeded.1"


async def test_a_quiet_stream_sends_keep_alive_comments(
    api: Api, sessions: Sessions, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "KEEP_ALIVE_S", 0.2)
    monkeypatch.setattr(events, "QUEUED_RECHECK_S", 0.1)
    kept_alive = once_sent(monkeypatch, b": keep-alive")
    job = await submit(api.client)

    def finish_once_kept_alive() -> None:
        if kept_alive.wait(timeout=30):
            _until_subscribed(redis_url)
            finish_job(sessions, job["id"], OUTPUTS, announce_to=redis_url)

    finisher = threading.Thread(target=finish_once_kept_alive, daemon=True)
    finisher.start()
    response = await asyncio.wait_for(api.client.get(f"/v1/jobs/{job['id']}/events"), 40)
    finisher.join(timeout=10)

    assert ": keep-alive" in response.text.split("\n")
    assert [e["id"] for e in statuses(response.text)] == ["queued.0", "succeeded.1"]


async def test_a_client_that_goes_away_frees_its_watch(
    db_url: str, redis_url: str, sessions: Sessions, models: Any
) -> None:
    app = create_app(Settings(database_url=db_url, broker_url=redis_url))
    with sessions.begin() as session:
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
    async with app.router.lifespan_context(app):
        state = app.state.tffleet
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tffleet") as client:
            client.headers["Authorization"] = f"Bearer {key}"
            job = await submit(client)

        gone = asyncio.Event()
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if b"event: status" in message.get("body", b""):
                assert state.waiter.watches == 1
                gone.set()  # the client hangs up after the first event

        path = f"/v1/jobs/{job['id']}/events"
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"tffleet"), (b"authorization", f"Bearer {key}".encode())],
            "server": ("tffleet", 80),
            "client": ("127.0.0.1", 12345),
        }
        await asyncio.wait_for(app(scope, receive, send), 5)

        assert gone.is_set()
        assert state.waiter.watches == 0
        assert job["id"] not in state.waiter._waiters


def test_event_ids_order_the_states_of_a_run() -> None:
    runs = [
        ["queued.0", "running.1", "queued.1", "running.2", "succeeded.2"],
        ["queued.0", "canceled.0"],
        ["queued.0", "running.1", "queued.1", "canceled.1"],
        ["queued.1", "running.2", "failed.2"],  # a retried job's run
    ]
    for run in runs:
        ranks = [events.rank(i) for i in run]
        assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks), run
    for junk in (None, "", "7", "queued", "queued.x", "lost.1", "queued.-1"):
        assert events.rank(junk) < events.rank("queued.0")


async def test_past_the_limit_of_held_requests_a_stream_is_503_with_retry_after(
    open_api: OpenApi,
) -> None:
    async with open_api(max_long_polls=0) as api:
        job = await submit(api.client)

        response = await api.client.get(f"/v1/jobs/{job['id']}/events")

    assert response.status_code == 503 and response.headers["retry-after"] == "1"
