"""The sweeper's leadership: one active sweeper across the fleet, by a Redis lock.

The lock has a short expiry, which `Leadership.keep` (a thread of the active sweeper's own)
extends every third of it, however long a sweep takes; the other sweepers stand by and take over
once it lapses. So a sweeper killed with its host is replaced within the expiry and a sweep
interval, which with the defaults (10 + 5 s) ends before that host's leases (15 s) do, plus a
sweep; a frozen sweeper (SIGSTOP) lets it lapse as a dead one does. Every step of a sweep is safe
to run twice at once (worker/sweeper.py), so a lock that lapses in the middle of one costs
duplicate messages, never a job.
"""

from __future__ import annotations

import logging
import threading

import redis
from prometheus_client import Gauge
from redis.exceptions import LockNotOwnedError

from tffleet.constants import SWEEPER_LOCK_KEY

log = logging.getLogger("worker.sweeper")  # the sweeper's lines, as operators grep them

ACTIVE = Gauge("tffleet_sweeper_active", "1 while this process holds the sweeper lock")
# The lock's expiry: at least this, and two sweep intervals (a standby polls once an interval).
MIN_TIMEOUT_S = 10.0


class Leadership:
    def __init__(self, redis_client: redis.Redis, sweep_interval_s: float) -> None:
        self.timeout_s = max(MIN_TIMEOUT_S, 2 * sweep_interval_s)
        self._lock = redis_client.lock(SWEEPER_LOCK_KEY, timeout=self.timeout_s, thread_local=False)
        self._leading = False
        self._standing_by = False

    def lead(self) -> bool:
        """Take or extend the lock; True while this sweeper is the active one.

        Raises `redis.RedisError` when Redis cannot be reached.
        """
        if self._leading:
            try:
                self._lock.reacquire()
                return True
            except LockNotOwnedError:
                self._lapsed()
        if self._lock.acquire(blocking=False):
            self._set_leading(True)
            log.info("this is the active sweeper (lock %s)", SWEEPER_LOCK_KEY)
            return True
        if not self._standing_by:
            log.info("another sweeper holds %s; standing by", SWEEPER_LOCK_KEY)
            self._standing_by = True
        return False

    def keep(self, stop: threading.Event) -> None:
        """Extend the lock every third of its expiry while this sweeper leads, until `stop`."""
        while not stop.wait(self.timeout_s / 3):
            if not self._leading:
                continue
            try:
                self._lock.reacquire()
            except LockNotOwnedError:
                self._lapsed()
            except redis.RedisError:
                pass  # the sweep loop logs Redis being away; the lock may lapse meanwhile

    def step_down(self) -> None:
        """Release the lock, if held, so a standby takes over at once instead of at expiry."""
        if not self._leading:
            return
        self._set_leading(False)
        try:
            self._lock.release()
        except redis.RedisError as exc:  # lapsed, or Redis is away: it expires on its own
            log.info("could not release the sweeper lock (%s)", exc)

    def _lapsed(self) -> None:
        if self._leading:
            self._set_leading(False)
            log.warning("sweeper lock lapsed (Redis or this process was too slow); standing by")

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        self._standing_by = False
        ACTIVE.set(1 if leading else 0)
