"""A worker child's two background threads that keep its models current.

- reports: every poll, write what the child holds (db.presence), so the API knows which workers
  are live and what they serve;
- rescans: every poll, or at once when `tffleet models reload` publishes on
  MODELS_RELOAD_CHANNEL, bring the child's models in line with the repository.

Loading a large model may take minutes: that is why reports have a thread of their own.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from tffleet.constants import MODELS_RELOAD_CHANNEL
from tffleet.redis_urls import redis_client
from worker.model_set import ModelSet

log = logging.getLogger(__name__)

# How long the rescan thread blocks on the reload channel before it looks at its stop flag.
LISTEN_SLICE_S = 0.2


class Watcher:
    def __init__(self, model_set: ModelSet, *, broker_url: str) -> None:
        self.model_set = model_set
        self._broker_url = broker_url
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._report, name="model-reports", daemon=True),
            threading.Thread(target=self._rescan, name="model-rescans", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def _report(self) -> None:
        while not self._stop.wait(self.model_set.poll_s):
            self.model_set.held.report_quietly()

    def _rescan(self) -> None:
        poll_s = self.model_set.poll_s
        channel: redis.client.PubSub | None = None
        broker_down = False
        while not self._stop.is_set():
            asked = False
            try:
                if channel is None:
                    channel = redis_client(self._broker_url, socket_connect_timeout=5).pubsub(
                        ignore_subscribe_messages=True
                    )
                    channel.subscribe(MODELS_RELOAD_CHANNEL)
                asked = self._listen(channel, poll_s)
                broker_down = False
            except redis.RedisError as exc:
                if not broker_down:
                    log.warning(
                        "cannot listen for `tffleet models reload` (%s); rescanning every %gs",
                        exc, poll_s,
                    )  # fmt: skip
                    broker_down = True
                if channel is not None:
                    channel.close()
                    channel = None
                self._stop.wait(poll_s)
            if self._stop.is_set():
                break
            try:
                self.model_set.refresh(retry=asked)
            except Exception:
                log.exception("rescanning the model repository failed; trying again next poll")
        if channel is not None:
            channel.close()

    def _listen(self, channel: redis.client.PubSub, poll_s: float) -> bool:
        """Whether a reload was asked for within `poll_s`, listening in short slices so that a
        stop (a warm shutdown, a test's fleet) never waits out a whole poll."""
        deadline = time.monotonic() + poll_s
        while not self._stop.is_set():
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return False
            if channel.get_message(timeout=min(left_s, LISTEN_SLICE_S)) is not None:
                return True
        return False
