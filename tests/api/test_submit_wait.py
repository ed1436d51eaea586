"""POST /v1/jobs?wait=: submit and long-poll in one round trip."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.waiter import CompletionWaiter
from db import secrets as fleet_secrets
from db.models import Job, JobStatus
from tests.api.conftest import Api, _until_subscribed, finish_job
from tffleet import announcements, tensors
from tffleet.announcements import EndedJob
from tffleet.constants import JOBS_DONE_CHANNEL

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

BODY = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
OUTPUTS = {"y": np.array([[0.5, -1.25, 3.0]], dtype=np.float32)}


class FakeWorker:
    """Finishes each queued job `delay_s` after it appears, announcing it as a worker does."""

    def __init__(self, sessions: Sessions, redis_url: str, delays_s: list[float]) -> None:
        self._sessions, self._redis_url, self._delays = sessions, redis_url, list(delays_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-worker", daemon=True)
        self.errors: list[BaseException] = []

    def __enter__(self) -> FakeWorker:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        try:
            _until_subscribed(self._redis_url)  # here: the test's event loop must run meanwhile
            while self._delays and not self._stop.is_set():
                with self._sessions() as session:
                    queued = session.scalars(
                        select(Job.id).where(Job.status == JobStatus.QUEUED.value).order_by(Job.id)
                    ).all()
                if not queued:
                    time.sleep(0.01)
                    continue
                time.sleep(self._delays.pop(0))
                finish_job(self._sessions, queued[0], OUTPUTS, announce_to=self._redis_url)
        except BaseException as exc:  # surfaced by __exit__, in the test's thread
            self.errors.append(exc)


@pytest.fixture
def worker(sessions: Sessions, redis_url: str) -> Iterator[Any]:
    def start(*delays_s: float) -> FakeWorker:
        return FakeWorker(sessions, redis_url, list(delays_s))

    yield start


async def test_submit_with_wait_answers_with_the_finished_job_and_its_outputs(
    api: Api, worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the periodic re-check pushed past the wait, only the announcement can end it in time:
    # no wall-clock bound that a loaded machine could break.
    monkeypatch.setattr(CompletionWaiter, "recheck_s", 60.0)
    with worker(0.2):
        started = time.monotonic()
        response = await api.client.post("/v1/jobs", params={"wait": "10"}, json=BODY)
        elapsed = time.monotonic() - started

    assert response.status_code == 202
    job = response.json()
    assert job["status"] == "succeeded"
    assert job["outputs"] == {"y": OUTPUTS["y"].tolist()}
    # Woken by the announcement, not by the 10 s limit.
    assert 0.2 <= elapsed < 10, elapsed


async def test_submit_with_wait_gives_up_after_wait_seconds_with_the_job_queued(
    api: Api,
) -> None:
    started = time.monotonic()

    response = await api.client.post("/v1/jobs", params={"wait": "0.5"}, json=BODY)

    assert response.status_code == 202
    assert response.json()["status"] == "queued" and response.json()["outputs"] is None
    assert 0.45 <= time.monotonic() - started < 5  # the wait, not the re-check or a default
    # Stored without its place (it was waited for), read again as the wait ended queued.
    assert response.json()["queue_position"] == 0  # none ahead of it


async def test_a_wait_over_before_it_began_still_shows_where_the_job_stands(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api import submission

    real = submission.wait_for

    async def late(*args: Any, **kwargs: Any) -> Any:  # as if the store took the whole wait
        return await real(*args, **{**kwargs, "wait_s": 1e-9})

    monkeypatch.setattr(submission, "wait_for", late)
    monkeypatch.setattr("api.routes.jobs.wait_for", late)

    response = await api.client.post("/v1/jobs", params={"wait": "5"}, json=BODY)

    assert response.json()["status"] == "queued"
    assert response.json()["queue_position"] == 0  # none ahead of it


async def test_bulk_submit_with_wait_holds_until_every_job_ended(api: Api, worker: Any) -> None:
    with worker(0.05, 0.4):
        started = time.monotonic()
        response = await api.client.post(
            "/v1/jobs", params={"wait": "10"}, json={"jobs": [BODY, BODY]}
        )
        elapsed = time.monotonic() - started

    jobs = response.json()["jobs"]
    assert [job["status"] for job in jobs] == ["succeeded", "succeeded"]
    assert all(job["outputs"] == {"y": OUTPUTS["y"].tolist()} for job in jobs)
    assert elapsed >= 0.45, elapsed


async def test_an_idempotent_replay_with_wait_of_a_finished_job_has_its_outputs(
    api: Api, sessions: Sessions
) -> None:
    headers = {"Idempotency-Key": "replay-with-wait"}
    first = (await api.client.post("/v1/jobs", json=BODY, headers=headers)).json()
    finish_job(sessions, first["id"], OUTPUTS)

    again = await api.client.post("/v1/jobs", params={"wait": "10"}, json=BODY, headers=headers)

    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first["id"]
    assert again.json()["outputs"] == {"y": OUTPUTS["y"].tolist()}


@pytest.mark.parametrize(
    "params", [{"wait": "31"}, {"wait": "-1"}, {"encoding": "hex"}], ids=["long", "neg", "enc"]
)
async def test_bad_wait_or_encoding_on_submit_is_422_and_stores_nothing(
    api: Api, sessions: Sessions, params: dict[str, str]
) -> None:
    response = await api.client.post("/v1/jobs", params=params, json=BODY)

    assert response.status_code == 422
    with sessions() as session:
        assert session.scalars(select(Job.id)).all() == []


async def test_the_waiter_remembers_an_ending_announced_before_the_watch_began() -> None:
    waiter = CompletionWaiter("redis://unused")
    waiter._wake([("early", None)])  # the announcement, as the listener delivers it

    with waiter.watch("early") as ended, waiter.watch("other") as not_yet:
        await asyncio.sleep(0)
        assert ended.is_set() and not not_yet.is_set()


async def test_a_job_announced_whole_is_answered_without_reading_the_database(
    api: Api, redis_url: str
) -> None:
    queued = (await api.client.post("/v1/jobs", json=BODY)).json()
    with api.sessions() as session:
        key = fleet_secrets.get(session=session, name=fleet_secrets.ANNOUNCEMENTS)
    # Announced whole, but never written: only an answer from the announcement says succeeded.
    announced = EndedJob(
        id=queued["id"],
        model=queued["model"],
        version=queued["version"],
        priority=queued["priority"],
        created_at=datetime.fromisoformat(queued["created_at"]),
        started_at=datetime.fromisoformat(queued["created_at"]),
        finished_at=datetime.fromisoformat(queued["created_at"]),
        attempts=1,
        worker="w",
        outputs=tensors.pack(OUTPUTS),
    )

    def announce() -> None:
        _until_subscribed(redis_url)
        with redis.Redis.from_url(redis_url) as client:
            client.publish(JOBS_DONE_CHANNEL, announcements.encode([announced], key=key))

    thread = threading.Thread(target=announce, daemon=True)
    thread.start()
    response = await api.client.get(f"/v1/jobs/{queued['id']}", params={"wait": "10"})
    thread.join(10)

    job = response.json()
    assert job["status"] == "succeeded" and job["worker"] == "w"
    assert job["outputs"] == {"y": OUTPUTS["y"].tolist()}


async def test_a_whole_job_announced_by_someone_without_the_key_is_never_the_answer(
    api: Api, redis_url: str
) -> None:
    queued = (await api.client.post("/v1/jobs", json=BODY)).json()
    forged = _whole(queued["id"])

    def announce() -> None:
        _until_subscribed(redis_url)
        with redis.Redis.from_url(redis_url) as client:
            client.publish(JOBS_DONE_CHANNEL, announcements.encode([forged], key=b"a guess"))
            client.publish(JOBS_DONE_CHANNEL, orjson.dumps([forged.as_item()]))

    thread = threading.Thread(target=announce, daemon=True)
    thread.start()
    response = await api.client.get(f"/v1/jobs/{queued['id']}", params={"wait": "1"})
    thread.join(10)

    assert response.json()["status"] == "queued"  # as the database holds it
    assert response.json()["outputs"] is None


def _whole(job_id: str) -> EndedJob:
    now = datetime.fromisoformat("2026-11-21T08:00:00+00:00")
    return EndedJob(
        id=job_id, model="mlp", version=2, priority=0, created_at=now, started_at=now,
        finished_at=now, attempts=1, worker="w", outputs=tensors.pack(OUTPUTS),
    )  # fmt: skip


async def test_the_waiter_keeps_a_job_whole_only_for_its_watchers() -> None:
    waiter = CompletionWaiter("redis://unused")
    message = announcements.encode([_whole("watched"), _whole("unwatched")], key=b"k")

    with waiter.watch("watched"):
        waiter._wake(announcements.decode(message, key=b"k", wanted=waiter._waiters))
        assert waiter.ended("watched") == _whole("watched")
        assert waiter.ended("unwatched") is None  # not decoded: nobody waits for it

    # Its watch ended: the outputs are let go, the ending is still remembered.
    assert waiter.ended("watched") is None
    with waiter.watch("watched") as ended:
        assert ended.is_set()
