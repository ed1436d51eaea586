"""The broker contract: JSON-only messages, the settings that keep jobs safe, a queue per model."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from celery import Celery

from tests.sentinels import SentinelGroup
from tffleet.broker import (
    ONCE_MAX_JOBS,
    PRIORITY_RETRY,
    PRIORITY_WAKE,
    RUN_BATCH_TASK,
    VERSION_HEADER,
    Publisher,
    fresh_channel,
    make_celery,
    queue_for,
    queue_lists,
    wake_up_list,
)
from tffleet.settings import Settings


@pytest.fixture
def settings() -> Settings:
    return Settings(model_load_timeout_s=900, visibility_timeout_s=7200, lease_s=60)


def test_messages_are_json_only_never_pickle(settings: Settings) -> None:
    conf = make_celery(settings).conf

    assert conf.accept_content == ["json"]
    assert conf.task_serializer == "json"
    assert conf.result_serializer == "json"


def test_a_message_is_acknowledged_after_its_batch_and_redelivered_if_the_child_dies(
    settings: Settings,
) -> None:
    conf = make_celery(settings).conf

    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1


def test_celery_waits_for_a_child_to_load_its_models(settings: Settings) -> None:
    conf = make_celery(settings).conf

    assert conf.worker_proc_alive_timeout >= settings.model_load_timeout_s


def test_redis_redelivers_only_after_the_visibility_timeout_from_settings(
    settings: Settings,
) -> None:
    conf = make_celery(settings).conf

    assert conf.broker_transport_options["visibility_timeout"] == 7200
    assert conf.broker_transport_options["visibility_timeout"] > settings.lease_s


def test_a_child_stuck_past_the_visibility_timeout_is_killed_by_the_pool(
    settings: Settings,
) -> None:
    conf = make_celery(settings).conf

    assert conf.task_time_limit == settings.visibility_timeout_s


def test_each_model_has_its_own_queue() -> None:
    assert queue_for("resnet") == "tffleet.resnet"
    assert queue_for("resnet") != queue_for("bert")


@pytest.fixture
def redis_app(redis_url: str) -> Iterator[Celery]:
    app = make_celery(Settings(broker_url=redis_url))
    yield app
    app.close()


def test_a_published_batch_message_is_json_on_the_wire(redis_app: Celery, redis_url: str) -> None:
    redis_app.send_task(RUN_BATCH_TASK, args=["m", 2, ["job-1"]], queue=queue_for("m"))

    client = redis.Redis.from_url(redis_url)
    try:
        (raw,) = client.lrange(queue_for("m"), 0, -1)
    finally:
        client.close()
    message = orjson.loads(raw)
    assert message["content-type"] == "application/json"
    assert message["headers"]["task"] == RUN_BATCH_TASK
    args, kwargs, _ = orjson.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == (["m", 2, ["job-1"]], {})


def test_a_retried_jobs_wake_up_is_taken_before_plain_ones_published_earlier(
    redis_app: Celery,
) -> None:
    publisher = Publisher(redis_app)
    for n in range(3):
        assert publisher.publish(model="m", version=1, job_ids=[f"new-{n}"])
    assert publisher.publish(model="m", version=1, job_ids=["taken-back"], retry=True)

    taken = []
    with redis_app.connection_for_read() as conn:
        queue = conn.SimpleQueue(queue_for("m"))
        try:
            for _ in range(4):
                message = queue.get(timeout=5)
                taken.append(message.payload[0][2][0])  # run_batch(model, version, job_ids)
                message.ack()
        finally:
            queue.close()
    assert taken == ["taken-back", "new-0", "new-1", "new-2"]


def _without_ids(raw: bytes) -> dict[str, object]:
    """A stored message with what differs per message (ids, tags, its sender) left out, and its
    body decoded."""
    message = orjson.loads(raw)
    for key in ("id", "root_id", "origin"):
        message["headers"].pop(key)
    for key in ("correlation_id", "reply_to", "delivery_tag"):
        message["properties"].pop(key)
    message["body"] = orjson.loads(base64.b64decode(message["body"]))
    return dict(message)


@pytest.mark.parametrize("retry", [False, True])
def test_a_wake_up_is_stored_as_celery_would_store_it(
    redis_app: Celery, redis_url: str, retry: bool
) -> None:
    # The publisher writes Celery's message itself (one LPUSH): a worker must not be able to
    # tell it from what `send_task` stores, on the same list.
    model, priority = f"stored-{retry}", PRIORITY_RETRY if retry else PRIORITY_WAKE
    queue = queue_for(model)
    redis_app.send_task(
        RUN_BATCH_TASK, args=[model, 2, ["job-1", "job-2"]], queue=queue, priority=priority
    )
    assert Publisher(redis_app).publish(
        model=model, version=2, job_ids=["job-1", "job-2"], retry=retry
    )

    client = redis.Redis.from_url(redis_url)
    try:
        other = queue_lists(queue)[0 if priority else 1]
        assert client.llen(other) == 0
        celerys, ours = client.lrange(wake_up_list(queue, priority), 0, -1)[::-1]
    finally:
        client.close()
    # ... but for the header that names the version (for `publish(once=True)`).
    assert orjson.loads(ours)["headers"].pop(VERSION_HEADER) == "2"
    stored = _without_ids(ours)
    assert stored["headers"].pop(VERSION_HEADER) == "2"  # type: ignore[attr-defined]
    assert stored == _without_ids(celerys)
    assert orjson.loads(ours)["headers"]["id"] == orjson.loads(ours)["properties"]["correlation_id"]


def test_a_fresh_jobs_wake_up_is_left_out_while_one_for_its_version_waits_to_be_taken(
    redis_app: Celery, redis_url: str
) -> None:
    publisher = Publisher(redis_app)
    waiting = wake_up_list(queue_for("once"), PRIORITY_WAKE)
    client = redis.Redis.from_url(redis_url)
    try:
        assert publisher.publish(model="once", version=1, job_ids=["a"], once=True)
        assert publisher.publish(model="once", version=1, job_ids=["b"], once=True)
        assert (client.llen(waiting), publisher.skipped) == (1, 1)
        # Another version's message, one naming many jobs (to share out), a taken-back job's,
        # and any without `once` are always pushed.
        assert publisher.publish(model="once", version=12, job_ids=["c"], once=True)
        many = [f"m{n}" for n in range(ONCE_MAX_JOBS + 1)]
        assert publisher.publish(model="once", version=1, job_ids=many, once=True)
        assert publisher.publish(model="once", version=1, job_ids=["d"], retry=True, once=True)
        assert publisher.publish(model="once", version=1, job_ids=["e"])
        assert (client.llen(waiting), publisher.skipped) == (4, 1)
        # The newest waiting message is version 1's: a version-1 wake-up is left out again; once
        # every message was taken (as a worker's BRPOP takes them), one is pushed.
        assert publisher.publish(model="once", version=1, job_ids=["f"], once=True)
        assert publisher.skipped == 2
        client.delete(waiting)
        assert publisher.publish(model="once", version=1, job_ids=["g"], once=True)
        assert (client.llen(waiting), publisher.skipped) == (1, 2)
    finally:
        client.close()


def test_a_child_waiting_for_fresh_jobs_hears_them_and_a_once_wake_up_is_then_left_out(
    redis_app: Celery, redis_url: str
) -> None:
    publisher = Publisher(redis_app)
    waiting = wake_up_list(queue_for("heard"), PRIORITY_WAKE)
    client = redis.Redis.from_url(redis_url)
    ear = client.pubsub()
    try:
        ear.subscribe(fresh_channel("heard", 1))
        assert ear.get_message(timeout=1)["type"] == "subscribe"  # type: ignore[index]

        # The child claims these itself: no message.
        assert publisher.publish(model="heard", version=1, job_ids=["a"], once=True)
        assert (client.llen(waiting), publisher.heard, publisher.skipped) == (0, 1, 1)
        # Heard and pushed: a wake-up that is not `once` (or names many jobs, to share out).
        assert publisher.publish(model="heard", version=1, job_ids=["b"])
        many = [f"m{n}" for n in range(ONCE_MAX_JOBS + 1)]
        assert publisher.publish(model="heard", version=1, job_ids=many, once=True)
        assert (client.llen(waiting), publisher.heard) == (2, 1)
        # Not heard: another version's, and a taken-back job's (no claim of fresh jobs takes it).
        assert publisher.publish(model="heard", version=2, job_ids=["c"], once=True)
        assert publisher.publish(model="heard", version=1, job_ids=["d"], retry=True)
        heard = [ear.get_message(timeout=1) for _ in range(3)]
        assert [m["data"] for m in heard if m] == [b"1", b"1", b"1"]
        assert ear.get_message(timeout=0.2) is None
    finally:
        ear.close()
        client.close()


def test_a_publish_to_a_redis_that_is_away_fails_at_once_and_backs_off() -> None:
    publisher = Publisher(make_celery(Settings(broker_url="redis://127.0.0.1:1/0")))

    assert not publisher.publish(model="m", version=1, job_ids=["a"])
    # Within PUBLISH_BACKOFF_S the next publish does not even try.
    assert not publisher.publish(model="m", version=1, job_ids=["b"])


@pytest.mark.slow  # starts processes
def test_a_wake_up_reaches_the_master_of_a_sentinel_url(tmp_path: Path) -> None:
    group = SentinelGroup(tmp_path / "sentinels", password="m@ster/pw", sentinel_password="sntl")
    try:
        group.start()
        publisher = Publisher(make_celery(Settings(broker_url=group.url)))
        assert publisher.publish(model="m", version=1, job_ids=["j"])
        with group.client("master") as master:
            assert master.llen(wake_up_list(queue_for("m"), PRIORITY_WAKE)) == 1
    finally:
        group.stop()
