"""A task that ran out of queued jobs waits a moment (`LINGER_S`) for more of its model version
before it ends, and hears of them itself: the API's publish of fresh jobs tells a child that
listens on the version's channel (`tffleet.broker.fresh_channel`), and pushes no message when
one heard. The child then claims them in the task it runs, without a Celery message's trip
through Redis, the worker's main process and the pipe to the child (about a millisecond of an
idle round trip, and the main process's CPU), and without a second task that would find them
claimed already.

The database still decides what runs: a child that heard claims as any task claims, and may
find nothing (another child's claim took the jobs). A publish a listening child heard pushed no
message, so the child acts on every message that reached it: heard while it listened, or
published before its unsubscribe took effect (read up to the unsubscribe's confirmation), it
claims; and where Redis failed under it, whatever reached it unread is taken as heard, and it
claims. A child that dies after it heard leaves the jobs queued without a message: the sweeper
republishes them (docs/explanation/guarantees.md, "Wake-ups").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import redis

from tffleet.broker import fresh_channel
from tffleet.redis_urls import redis_client

log = logging.getLogger(__name__)

# How long a task whose queue ran dry listens for more of its version before it ends. Another
# model's message waits for the child this much longer at most (a task's budget is a second).
LINGER_S = 0.05
# How long it waits for Redis to confirm an unsubscribe (what came before it was heard).
_CONFIRM_S = 1.0


class Listener:
    """A child's ear for fresh jobs of the model version its task runs: one Redis connection,
    subscribed only while it waits (`wait`), from the feeder's thread alone."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._pubsub: redis.client.PubSub | None = None

    @classmethod
    def connect(cls, broker_url: str) -> Listener:
        return cls(redis_client(broker_url, socket_timeout=5))

    def wait(
        self, model: str, version: int, *, waiting: Callable[[], bool], seconds: float = LINGER_S
    ) -> bool:
        """Whether fresh jobs of this model version wait: `waiting()` (read once subscribed, so
        that a job committed after it is one whose publish comes after the subscription), or
        one published in the next `seconds` (True as soon as one was; True too where Redis
        failed, for the claim to decide)."""
        channel = fresh_channel(model, version)
        try:
            pubsub = self._pubsub = self._pubsub or self._client.pubsub()
            pubsub.subscribe(channel)
            heard = waiting()
            deadline = time.monotonic() + seconds
            while not heard and (left := deadline - time.monotonic()) > 0:
                message = pubsub.get_message(timeout=left)
                heard = message is not None and message["type"] == "message"
            pubsub.unsubscribe(channel)
            while (message := pubsub.get_message(timeout=_CONFIRM_S)) is not None:
                if message["type"] == "unsubscribe":
                    return heard
                heard = heard or message["type"] == "message"
            raise redis.TimeoutError("no confirmation of the unsubscribe")
        except redis.RedisError as exc:
            log.warning("listening for fresh %s jobs failed (%s); claiming to see", model, exc)
            self.close()
            return True
        except BaseException:  # `waiting()`'s: no subscription outlives the wait
            self.close()
            raise

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError):  # a connection already gone
                pubsub.close()
