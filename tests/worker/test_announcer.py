"""The one announcer of ended jobs: signed with the fleet's key in a child, bare ids elsewhere."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
import pytest
import redis

from tffleet import announcements
from tffleet.announcements import EndedJob
from tffleet.constants import JOBS_DONE_CHANNEL
from worker.announcer import Announcer

KEY = b"0123456789abcdef" * 4
JOB = EndedJob(
    id="0190a000-0000-7000-8000-000000000001",
    model="m",
    version=1,
    priority=0,
    created_at=datetime(2026, 11, 21, 8, 0, 0, tzinfo=UTC),
    started_at=datetime(2026, 11, 21, 8, 0, 1, tzinfo=UTC),
    finished_at=datetime(2026, 11, 21, 8, 0, 2, tzinfo=UTC),
    attempts=1,
    worker="host/1/cpu:0/abc",
    outputs=b"TFT1 outputs",
)


@pytest.fixture
def heard(redis_url: str) -> Iterator[redis.client.PubSub]:
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(JOBS_DONE_CHANNEL)
    pubsub.get_message(timeout=1)  # the subscription's confirmation
    yield pubsub
    pubsub.close()
    client.close()


def test_a_childs_announcement_is_signed_and_carries_a_small_job_whole(
    redis_url: str, heard: redis.client.PubSub
) -> None:
    Announcer.connect(redis_url, key=KEY)(["plain-id", JOB])

    message = heard.get_message(timeout=5)

    assert message is not None
    assert announcements.decode(message["data"], key=KEY) == [("plain-id", None), (JOB.id, JOB)]


def test_without_a_key_an_announcement_is_bare_ids(
    redis_url: str, heard: redis.client.PubSub
) -> None:
    Announcer.connect(redis_url)(["plain-id", JOB])

    message = heard.get_message(timeout=5)

    assert message is not None and orjson.loads(message["data"]) == ["plain-id", JOB.id]


def test_an_announcement_redis_does_not_take_is_logged_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="worker.announcer"):
        Announcer.connect("redis://127.0.0.1:1/0")(["a", "b"])  # nothing listens on port 1

    assert "could not announce 2 ended jobs" in caplog.text
