"""Tells the API's long-polls and event streams that jobs ended, on JOBS_DONE_CHANNEL.

Three processes end jobs and announce them once the change is committed: a worker child (its
batches, and the jobs a claim canceled for their deadline), a worker's main process (a dead
child's jobs that used their attempts, worker/orphans.py) and the sweeper (expired leases,
deadlines, split jobs whose part failed). A child holds the fleet's announcement key, so its
messages are signed and may carry a small succeeded job whole (tffleet/announcements.py); the
other two hold no key and announce bare ids, which a long-poll takes as a hint and then reads
the database.

A failed publish is logged and dropped: a long-poll that misses it answers from the database at
its next read, late but right. The database is the truth; an announcement only saves time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import orjson
import redis

from tffleet import announcements
from tffleet.announcements import EndedJob
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.redis_urls import redis_client

log = logging.getLogger(__name__)

# What a batcher calls once jobs ended (after their commit): ids, or whole jobs.
Notify = Callable[[Sequence[str | EndedJob]], None]


class Announcer:
    """Publishes ended jobs on JOBS_DONE_CHANNEL: signed under `key`, or bare ids without one."""

    def __init__(self, client: redis.Redis, *, key: bytes | None = None) -> None:
        self._client = client
        self._key = key

    @classmethod
    def connect(cls, broker_url: str, *, key: bytes | None = None) -> Announcer:
        """An announcer on a Redis connection of its own, each call bounded (5 s)."""
        return cls(redis_client(broker_url, socket_timeout=5), key=key)

    def __call__(self, ended: Sequence[str | EndedJob]) -> None:
        if self._key is not None:
            message = announcements.encode(list(ended), key=self._key)
        else:  # a whole job is only for a message the API can trust
            message = orjson.dumps([e if isinstance(e, str) else e.id for e in ended])
        try:
            self._client.publish(JOBS_DONE_CHANNEL, message)
        except redis.RedisError as exc:
            log.warning(
                "could not announce %d ended jobs (%s); their long-polls see it late",
                len(ended), exc,
            )  # fmt: skip
