"""The sweeper against a real Redis (lock, Celery messages) and both database backends."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import orjson
import pytest
import redis
from celery import Celery
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from db import cache, jobs, presence
from db.clock import utcnow
from db.engine import make_engine, make_sessionmaker
from db.models import CacheEntry, Job, JobInput, JobStatus, ModelPresence, PresenceState
from tffleet.broker import Publisher, make_celery, queue_for, queue_lists
from tffleet.constants import JOBS_DONE_CHANNEL, SWEEPER_LOCK_KEY
from tffleet.settings import Settings
from worker import leadership
from worker.sweeper import Sweeper, SweepReport

pytestmark = pytest.mark.both_databases

Sessions = sessionmaker[Session]
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


class Clock:
    """The sweeper's idea of now, moved forward by the tests."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self, session: Session | None = None) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def settings(db_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        broker_url=redis_url,
        sweep_interval_s=0.05,
        republish_after_s=30,
        result_ttl_s=7 * 24 * 3600,
        lease_s=60,
        max_attempts=3,
        max_batch_size=128,
    )


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def celery(settings: Settings) -> Iterator[Celery]:
    app = make_celery(settings)
    yield app
    app.close()


MakeSweeper = Callable[..., Sweeper]


@pytest.fixture
def make_sweeper(
    sessions: Sessions, celery: Celery, settings: Settings, client: redis.Redis
) -> MakeSweeper:
    def make(clock: Clock | None = None, **overrides: object) -> Sweeper:
        return Sweeper(
            sessions,
            Publisher(celery),
            settings.model_copy(update=overrides),
            client,
            clock=clock or Clock(),
        )

    return make


def create(sessions: Sessions, count: int = 1, *, model: str = "m", version: int = 1) -> list[str]:
    new = [jobs.NewJob(model=model, version=version, samples=1, inputs=b"in")] * count
    with sessions.begin() as session:
        return [row.id for row in jobs.create(session=session, jobs=new)]


def hold(sessions: Sessions, at: datetime, *keys: tuple[str, int], child: str = "c") -> None:
    """Report, as of `at`, a live worker child that holds these model versions (default m:1)."""
    holdings = [
        presence.Holding(name, version, PresenceState.LOADED, f"/models/{name}/{version}", at)
        for name, version in keys or [("m", 1)]
    ]
    with sessions.begin() as session:
        presence.report(
            session=session,
            child=presence.Child(id=child, host="h", pid=1, device="cpu:0"),
            holdings=holdings,
            now=at,
        )


def read(sessions: Sessions, job_id: str) -> Job:
    with sessions() as session:
        return jobs.get(session=session, job_id=job_id)


def messages(client: redis.Redis, model: str = "m") -> list[tuple[str, int, list[str]]]:
    """The run_batch calls waiting in the model's Celery queue (Redis lists), in delivery order."""
    found = []
    for name in queue_lists(queue_for(model)):
        for raw in reversed(client.lrange(name, 0, -1)):
            args, _kwargs, _embed = orjson.loads(base64.b64decode(orjson.loads(raw)["body"]))
            found.append((args[0], args[1], args[2]))
    return found


def run_in_thread(sweeper: Sweeper) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=sweeper.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def wait_until(check: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# One sweep


def test_a_queued_job_whose_wakeup_was_lost_is_published_again(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock)
    (job_id,) = create(sessions)  # its submit-time wake-up never reached Redis

    assert sweeper.sweep_once().republished == 0  # too young to call its wake-up lost
    clock.advance(31)
    hold(sessions, clock.now)
    report = sweeper.sweep_once()

    assert (report.republished, report.messages) == (1, 1)
    assert messages(client) == [("m", 1, [job_id])]
    assert read(sessions, job_id).published_at is not None
    clock.advance(10)
    hold(sessions, clock.now)
    assert sweeper.sweep_once().republished == 0  # published 10 s ago: not lost yet
    clock.advance(21)
    hold(sessions, clock.now)
    assert sweeper.sweep_once().republished == 1


def test_queued_jobs_of_a_version_no_live_child_holds_stay_queued_without_wake_ups(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock)
    (held,) = create(sessions, model="m", version=1)
    (other_version,) = create(sessions, model="m", version=2)
    (unserved,) = create(sessions, model="b")
    clock.advance(31)
    hold(sessions, clock.now - timedelta(seconds=60), ("b", 1), child="dead")  # died long ago
    hold(sessions, clock.now)

    report = sweeper.sweep_once()

    assert report.republished == 1
    assert messages(client, "m") == [("m", 1, [held])]
    assert messages(client, "b") == []
    clock.advance(1)
    hold(sessions, clock.now, ("m", 1), ("m", 2), ("b", 1))  # a worker for them came up
    assert sweeper.sweep_once().republished == 2
    assert messages(client, "b") == [("b", 1, [unserved])]
    assert messages(client, "m")[1:] == [("m", 2, [other_version])]


def test_the_reports_of_dead_worker_children_are_deleted(
    make_sweeper: MakeSweeper, sessions: Sessions, settings: Settings
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock)
    hold(sessions, clock.now, child="live")
    silent_for = 3 * settings.model_poll_s + 1
    hold(sessions, clock.now - timedelta(seconds=silent_for), child="dead")

    sweeper.sweep_once()

    with sessions() as session:
        assert list(session.scalars(select(ModelPresence.child))) == ["live"]


def test_an_expired_lease_is_requeued_and_published_at_once(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock)
    (job_id,) = create(sessions)
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="dead", lease_s=60)
    clock.advance(61)

    report = sweeper.sweep_once()

    assert (report.requeued, report.republished, report.worker_lost) == (1, 1, 0)
    assert messages(client) == [("m", 1, [job_id])]
    job = read(sessions, job_id)
    assert (job.status, job.lease_owner) == (JobStatus.QUEUED, None)
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"late")]) == 0


def test_requeued_jobs_go_out_in_messages_of_at_most_max_batch_size_per_model(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock, max_batch_size=2)
    a = create(sessions, 5, model="a")
    b = create(sessions, 1, model="b", version=4)
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=a + b, owner="dead", lease_s=60)
    clock.advance(61)

    report = sweeper.sweep_once()

    assert (report.requeued, report.messages) == (6, 4)
    assert messages(client, "a") == [("a", 1, a[:2]), ("a", 1, a[2:4]), ("a", 1, a[4:])]
    assert messages(client, "b") == [("b", 4, b)]


def test_a_job_out_of_attempts_fails_worker_lost_and_long_polls_hear_of_it(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock, max_attempts=1)
    (job_id,) = create(sessions)
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[job_id], owner="dead", lease_s=60)
    clock.advance(61)
    pubsub = client.pubsub()
    pubsub.subscribe(JOBS_DONE_CHANNEL)
    subscribed = pubsub.get_message(timeout=5)
    assert subscribed is not None and subscribed["type"] == "subscribe"

    report = sweeper.sweep_once()

    assert (report.worker_lost, report.requeued, report.messages) == (1, 0, 0)
    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "worker_lost")
    announced = pubsub.get_message(timeout=5)
    pubsub.close()
    assert announced is not None and orjson.loads(announced["data"]) == [job_id]
    assert messages(client) == []


def test_queued_and_running_jobs_past_their_deadline_are_canceled_and_long_polls_hear_of_it(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock)
    new = jobs.NewJob(model="m", version=1, samples=1, inputs=b"in", cancel_after_s=30)
    with sessions.begin() as session:
        queued, running, later = (row.id for row in jobs.create(session=session, jobs=[new] * 3))
        session.execute(update(Job).where(Job.id == later).values(deadline_at=None))
        (lease,) = jobs.claim(session=session, job_ids=[running], owner="w", lease_s=600)
    assert sweeper.sweep_once().deadline == 0
    clock.advance(31)
    pubsub = client.pubsub()
    pubsub.subscribe(JOBS_DONE_CHANNEL)
    subscribed = pubsub.get_message(timeout=5)
    assert subscribed is not None and subscribed["type"] == "subscribe"

    report = sweeper.sweep_once()

    assert report.deadline == 2 and report.worker_lost == report.requeued == 0
    for job_id in (queued, running):
        job = read(sessions, job_id)
        assert (job.status, job.error_code) == (JobStatus.CANCELED, "deadline")
    assert read(sessions, later).status == JobStatus.QUEUED
    with sessions.begin() as session:  # the running one's late result is fenced out
        assert jobs.complete(session=session, results=[(lease, b"late")]) == 0
    announced = pubsub.get_message(timeout=5)
    pubsub.close()
    assert announced is not None and sorted(orjson.loads(announced["data"])) == sorted(
        [queued, running]
    )


def test_queued_jobs_not_started_within_their_queue_timeout_are_canceled_and_announced(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock)
    new = jobs.NewJob(model="m", version=1, samples=1, inputs=b"in", queue_timeout_s=30)
    with sessions.begin() as session:
        queued, running, later = (row.id for row in jobs.create(session=session, jobs=[new] * 3))
        session.execute(update(Job).where(Job.id == later).values(queue_timeout_at=None))
        jobs.claim(session=session, job_ids=[running], owner="w", lease_s=600)
    assert sweeper.sweep_once().queue_timeout == 0
    clock.advance(31)
    pubsub = client.pubsub()
    pubsub.subscribe(JOBS_DONE_CHANNEL)
    subscribed = pubsub.get_message(timeout=5)
    assert subscribed is not None and subscribed["type"] == "subscribe"

    report = sweeper.sweep_once()

    assert report.queue_timeout == 1 and report.deadline == report.requeued == 0
    job = read(sessions, queued)
    assert (job.status, job.error_code, job.attempts) == (JobStatus.CANCELED, "queue_timeout", 0)
    assert job.started_at is None and job.device_s == 0
    # Started before its queue time-out ran out: it runs on; never given one: it waits on.
    assert read(sessions, running).status == JobStatus.RUNNING
    assert read(sessions, later).status == JobStatus.QUEUED
    announced = pubsub.get_message(timeout=5)
    pubsub.close()
    assert announced is not None and orjson.loads(announced["data"]) == [queued]
    assert sweeper.sweep_once().queue_timeout == 0


def test_old_finished_jobs_are_purged_and_the_rest_kept(
    make_sweeper: MakeSweeper, sessions: Sessions
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock, result_ttl_s=3600)
    done, queued = create(sessions, 2)
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[done], owner="w", lease_s=60)
        jobs.complete(session=session, results=[(lease, b"out")])

    assert sweeper.sweep_once().purged == 0
    clock.advance(3601)
    assert sweeper.sweep_once().purged == 1

    with sessions() as session:
        assert [job.id for job in jobs.get_many(session=session, job_ids=[done, queued])] == [
            queued
        ]


def test_ended_jobs_lose_their_inputs_after_input_ttl_and_keep_their_outputs(
    make_sweeper: MakeSweeper, sessions: Sessions
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock, input_ttl_s=600, result_ttl_s=3600)
    done, running, queued = create(sessions, 3)
    with sessions.begin() as session:
        (lease, _) = jobs.claim(session=session, job_ids=[done, running], owner="w", lease_s=60)
        jobs.complete(session=session, results=[(lease, b"out")])

    assert sweeper.sweep_once().inputs_purged == 0
    clock.advance(601)
    report = sweeper.sweep_once()

    assert (report.inputs_purged, report.purged) == (1, 0)
    assert inputs_kept(sessions) == {running, queued}
    with sessions() as session:
        assert jobs.get(session=session, job_id=done).outputs == b"out"


def test_inputs_past_their_retention_go_in_chunks_and_later_ends_in_later_sweeps(
    make_sweeper: MakeSweeper, sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.sweeper.CHUNK_JOBS", 2)
    clock = Clock()
    sweeper = make_sweeper(clock, input_ttl_s=600)
    end(sessions, create(sessions, 5), at=clock.now)
    clock.advance(601)
    assert sweeper.sweep_once().inputs_purged == 5

    end(sessions, create(sessions, 1), at=clock.now)
    assert sweeper.sweep_once().inputs_purged == 0
    clock.advance(601)
    assert sweeper.sweep_once().inputs_purged == 1
    assert inputs_kept(sessions) == set()


def end(sessions: Sessions, job_ids: list[str], *, at: datetime) -> None:
    """End jobs (canceled) at `at`, by the sweeper's clock."""
    with sessions.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id.in_(job_ids))
            .values(status=JobStatus.CANCELED.value, finished_at=at)
        )


def inputs_kept(sessions: Sessions) -> set[str]:
    with sessions() as session:
        return set(session.scalars(select(JobInput.job_id)))


def test_cache_entries_go_by_age_then_oldest_first_over_the_size_bound(
    make_sweeper: MakeSweeper, sessions: Sessions
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock, cache_ttl_s=3600, cache_max_bytes=25)
    with sessions.begin() as session:
        for n, age_s in enumerate([3000, 2000, 1000]):
            stored = clock.now - timedelta(seconds=age_s)
            cache.remember(session=session, entries=[(f"k{n}", b"o" * 10)], now=stored)

    assert sweeper.sweep_once().cache_purged == 1  # 30 bytes: the oldest goes
    assert cached_keys(sessions) == ["k1", "k2"]
    clock.advance(1700)
    assert sweeper.sweep_once().cache_purged == 1  # k1 is 3700 s old
    clock.advance(1000)
    assert sweeper.sweep_once().cache_purged == 1
    assert cached_keys(sessions) == []


def test_a_cache_entry_outlives_the_job_that_made_it(
    make_sweeper: MakeSweeper, sessions: Sessions
) -> None:
    clock = Clock()
    sweeper = make_sweeper(clock, result_ttl_s=3600, cache_ttl_s=7200)
    key = cache.key(model="m", version=1, scope="default", inputs=b"in")
    new = jobs.NewJob(model="m", version=1, samples=1, inputs=b"in", cache_key=key)
    with sessions.begin() as session:
        (made,) = jobs.create(session=session, jobs=[new])
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[made.id], owner="w", lease_s=60)
        jobs.complete(session=session, results=[(lease, b"out")], now=clock.now)

    clock.advance(3601)
    report = sweeper.sweep_once()
    assert (report.purged, report.cache_purged) == (1, 0)
    with sessions() as session:
        assert jobs.get_many(session=session, job_ids=[made.id]) == []
    with sessions.begin() as session:
        (again,) = jobs.create(session=session, jobs=[new])
    assert (again.status, again.cached, again.outputs) == (JobStatus.SUCCEEDED, True, b"out")


def cached_keys(sessions: Sessions) -> list[str]:
    with sessions() as session:
        return sorted(session.scalars(select(CacheEntry.key)))


# The lock


def test_only_one_of_two_sweepers_holds_the_lock(
    make_sweeper: MakeSweeper, client: redis.Redis
) -> None:
    first, second = make_sweeper(), make_sweeper()

    assert first.lead() is True
    assert second.lead() is False
    assert first.lead() is True  # extended, still held
    ttl_ms = client.pttl(SWEEPER_LOCK_KEY)
    assert 0 < ttl_ms <= first.lock_timeout_s * 1000

    first.step_down()
    assert second.lead() is True
    assert first.lead() is False


def test_a_standby_takes_over_when_the_lock_lapses(
    make_sweeper: MakeSweeper, client: redis.Redis
) -> None:
    first, second = make_sweeper(), make_sweeper()
    assert first.lead() is True

    client.delete(SWEEPER_LOCK_KEY)  # as if it expired: the first sweeper hung or died

    assert second.lead() is True
    assert first.lead() is False  # it notices on its next extension and stands by


def test_the_lock_outlives_a_long_sweep_and_lapses_soon_after_its_sweeper_dies(
    make_sweeper: MakeSweeper, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The active sweeper's own thread extends the lock, however long a sweep takes; once it
    is gone (its host killed), a standby takes over within the lock's short expiry."""
    monkeypatch.setattr(leadership, "MIN_TIMEOUT_S", 0.6)
    slow, standby = make_sweeper(), make_sweeper()
    sweeping = threading.Event()

    def long_sweep() -> SweepReport:
        sweeping.set()
        time.sleep(2.0)  # over three expiries
        return SweepReport()

    monkeypatch.setattr(slow, "sweep_once", long_sweep)
    stop, thread = run_in_thread(slow)
    try:
        assert sweeping.wait(5)
        time.sleep(1.5)
        assert standby.lead() is False  # still held, mid-sweep
    finally:
        stop.set()
        thread.join(timeout=10)
    assert slow.lock_timeout_s == 0.6

    assert slow.lead() is True
    slow._leadership._leading = False  # as if its process died: nobody extends the lock
    wait_until(standby.lead, timeout_s=2)


def test_run_sweeps_only_while_it_holds_the_lock(
    make_sweeper: MakeSweeper, sessions: Sessions, client: redis.Redis
) -> None:
    clock = Clock()
    clock.advance(31)
    holder, standby = make_sweeper(), make_sweeper(clock)
    (job_id,) = create(sessions)
    hold(sessions, clock.now)
    assert holder.lead() is True

    stop, thread = run_in_thread(standby)
    try:
        time.sleep(0.3)  # several intervals
        assert messages(client) == []
        holder.step_down()
        wait_until(lambda: messages(client) == [("m", 1, [job_id])])
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert client.exists(SWEEPER_LOCK_KEY) == 0  # released on the way out


# Redis or the database going away


def test_a_sweep_with_the_broker_away_keeps_the_job_for_a_later_sweep(
    make_sweeper: MakeSweeper, sessions: Sessions, settings: Settings, client: redis.Redis
) -> None:
    clock = Clock()
    dead = make_celery(settings.model_copy(update={"broker_url": DEAD_REDIS}))
    away = Sweeper(sessions, Publisher(dead), settings, client, clock=clock)
    (job_id,) = create(sessions)
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[job_id], owner="dead", lease_s=60)
    clock.advance(61)

    report = away.sweep_once()
    dead.close()

    assert (report.requeued, report.republished, report.publish_failures) == (1, 0, 1)
    assert read(sessions, job_id).published_at is None
    hold(sessions, clock.now)
    assert make_sweeper(clock).sweep_once().republished == 1  # the broker is back
    assert messages(client) == [("m", 1, [job_id])]


def test_a_sweeper_survives_a_dead_redis_and_keeps_trying(
    sessions: Sessions, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    dead_settings = settings.model_copy(update={"broker_url": DEAD_REDIS})
    dead_celery = make_celery(dead_settings)
    dead_client = redis.Redis.from_url(DEAD_REDIS)
    sweeper = Sweeper(sessions, Publisher(dead_celery), dead_settings, dead_client)

    with caplog.at_level(logging.WARNING, logger="worker.sweeper"):
        stop, thread = run_in_thread(sweeper)
        wait_until(lambda: len([r for r in caplog.records if "sweep failed" in r.message]) >= 2)
        assert thread.is_alive()
        stop.set()
        thread.join(timeout=10)
    dead_celery.close()
    dead_client.close()

    assert not thread.is_alive()
    assert "ConnectionError" in caplog.records[0].message


def test_a_sweeper_survives_the_database_going_away(
    celery: Celery, settings: Settings, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine("postgresql://postgres@127.0.0.1:1/nowhere")  # nothing listens there
    sweeper = Sweeper(make_sessionmaker(engine), Publisher(celery), settings, client)

    with caplog.at_level(logging.WARNING, logger="worker.sweeper"):
        stop, thread = run_in_thread(sweeper)
        wait_until(lambda: len([r for r in caplog.records if "sweep failed" in r.message]) >= 2)
        assert client.exists(SWEEPER_LOCK_KEY) == 1  # it still leads while it retries
        stop.set()
        thread.join(timeout=10)
    engine.dispose()

    assert not thread.is_alive()
    assert client.exists(SWEEPER_LOCK_KEY) == 0
