"""worker/linger.py: a task whose queue ran dry listens a moment for fresh jobs of its version,
and runs those it hears of itself, with no message pushed for them; on the real Redis."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tests.worker.test_batching import FakeRunner, assert_own_outputs, policy, samples, submit
from tffleet.broker import PRIORITY_WAKE, Publisher, make_celery, queue_for, wake_up_list
from tffleet.settings import Settings
from worker.batching import Batcher
from worker.linger import Listener

Sessions = sessionmaker[Session]


@pytest.fixture
def publisher(redis_url: str) -> Publisher:
    app: Celery = make_celery(Settings(broker_url=redis_url))
    return Publisher(app)


@pytest.fixture
def listener(redis_url: str) -> Listener:
    return Listener.connect(redis_url)


def test_a_publish_while_it_listens_is_heard_at_once(
    listener: Listener, publisher: Publisher
) -> None:
    later = threading.Thread(
        target=lambda: publisher.publish(model="m", version=1, job_ids=["a"], once=True)
    )

    def dry_then_publish() -> bool:  # read once it is subscribed: the publish comes after
        later.start()
        return False

    assert listener.wait("m", 1, waiting=dry_then_publish, seconds=30)
    later.join()
    assert publisher.heard == 1


def test_nothing_published_for_its_version_is_not_heard(
    listener: Listener, publisher: Publisher, redis_url: str
) -> None:
    publisher.publish(model="m", version=2, job_ids=["a"], once=True)

    assert not listener.wait("m", 1, waiting=lambda: False, seconds=0.2)
    # Not listening any more: the next wake-up of version 1 is a message.
    assert publisher.publish(model="m", version=1, job_ids=["b"], once=True)
    assert publisher.heard == 0
    with redis.Redis.from_url(redis_url) as client:
        assert client.llen(wake_up_list(queue_for("m"), PRIORITY_WAKE)) == 2


def test_a_redis_that_fails_under_it_counts_as_heard_for_the_claim_to_decide() -> None:
    listener = Listener.connect("redis://127.0.0.1:1/0")
    assert listener.wait("m", 1, waiting=lambda: False, seconds=0.2)


def test_jobs_waiting_already_are_seen_at_once_and_a_failed_look_leaves_no_subscription(
    listener: Listener, publisher: Publisher
) -> None:
    started = time.monotonic()
    assert listener.wait("m", 1, waiting=lambda: True, seconds=30)
    assert time.monotonic() - started < 5

    def fails() -> bool:
        raise OperationalError("SELECT", {}, Exception("the database is away"))

    with pytest.raises(OperationalError):
        listener.wait("m", 1, waiting=fails)
    # Nobody listens: the next wake-up is a message, not a publish heard by no one.
    assert publisher.publish(model="m", version=1, job_ids=["a"], once=True)
    assert publisher.heard == 0


def test_a_task_runs_the_jobs_it_hears_of_after_its_queue_ran_dry_and_no_message_is_pushed(
    sessions: Sessions, listener: Listener, publisher: Publisher, redis_url: str
) -> None:
    first, second = samples(1, seed=0), samples(1, seed=1)
    named = submit(sessions, first)
    arrived: list[str] = []

    def arrive() -> None:  # as the API does: the row committed, then the wake-up published
        arrived.append(submit(sessions, second))
        publisher.publish(model="m", version=1, job_ids=arrived, once=True)

    batcher = Batcher(sessions=sessions, owner="t1", lease_s=30, notify=lambda _: None)
    batcher.listener = listener
    # Once it listens and has found its queue dry, not on a timer: on a loaded machine a 20 ms
    # timer fired before the first claim, which then took both jobs without hearing of one.
    later = threading.Thread(target=arrive)
    wait = listener.wait

    def arrives_while_it_listens(model: str, version: int, *, waiting: Any, **kw: Any) -> bool:
        if later.ident is not None:  # lingering again, after the second job's batch
            return wait(model, version, waiting=waiting, **kw)

        def dry_then_arrive() -> bool:
            found = waiting()
            later.start()
            return bool(found)

        # Up to 30 s, not LINGER_S (the machine may be slow): it ends once it hears the publish.
        return wait(model, version, waiting=dry_then_arrive, seconds=30)

    listener.wait = arrives_while_it_listens  # type: ignore[method-assign]
    report = batcher.run(
        model="m", version=1, job_ids=[named], runner=FakeRunner(), policy=policy()
    )
    later.join(timeout=30)

    assert report.claimed == 2 and publisher.heard == 1
    assert_own_outputs(sessions, named, first)
    assert_own_outputs(sessions, arrived[0], second)
    with redis.Redis.from_url(redis_url) as client:
        assert client.llen(wake_up_list(queue_for("m"), PRIORITY_WAKE)) == 0


def test_a_task_without_a_listener_ends_when_its_queue_runs_dry(sessions: Sessions) -> None:
    named = submit(sessions, samples(1, seed=0))
    batcher = Batcher(sessions=sessions, owner="t1", lease_s=30, notify=lambda _: None)

    report = batcher.run(
        model="m", version=1, job_ids=[named], runner=FakeRunner(), policy=policy()
    )

    assert report.claimed == 1


def test_jobs_queued_already_run_in_the_task_without_a_publish_to_hear(
    sessions: Sessions, listener: Listener
) -> None:
    # One sample a batch: each claim takes one job, and the queue never looks busy.
    queued = [submit(sessions, samples(1, seed=i)) for i in range(3)]
    batcher = Batcher(sessions=sessions, owner="t1", lease_s=30, notify=lambda _: None)
    batcher.listener = listener

    report = batcher.run(
        model="m", version=1, job_ids=queued[:1], runner=FakeRunner(),
        policy=policy(max_batch_size=1, buckets=(1,)),
    )  # fmt: skip

    assert report.claimed == 3
