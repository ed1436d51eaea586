"""Admission: what a submission may ask, and whether the queue has room for it.

- The fleet's queue limit, TFFLEET_MAX_QUEUED_JOBS (429 `queue_full`).
- A tenant's quotas (`db.tenants.Limits`): its queued jobs (429 `quota_exceeded`), samples per
  job and priority (422, checked job by job in the route), retention (cut to its longest).
- A key's own limits (`db.key_limits.KeyLimits`, api/key_limits.py): its cap on queued plus
  running jobs and its rate (429 `rate_limited`); its models are checked job by job.

Counts and limits are read at most every `COUNT_TTL_S` / `LIMITS_TTL_S`: a read per submit would
cost more than the insert. Between two counts each process adds up what it admitted, so a burst
cannot overshoot by much more than what other API processes admit meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from api.key_limits import RateLimiter
from db import jobs, key_limits, tenants
from db.tenants import Caller, Limits
from tffleet.errors import QueueFull, QuotaExceeded, RateLimited
from tffleet.settings import Settings

COUNT_TTL_S = 0.5
LIMITS_TTL_S = 5.0


class _Count:
    """The queued jobs of one scope (the fleet, or a tenant), counted at most every TTL."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count
        self._lock = asyncio.Lock()
        self._counted_at = -float("inf")
        self.queued = 0  # at the last count, plus what was admitted since

    async def fresh(self) -> int:
        if time.monotonic() - self._counted_at >= COUNT_TTL_S:
            async with self._lock:  # one count for all the requests that find it stale
                if time.monotonic() - self._counted_at >= COUNT_TTL_S:
                    self.queued = await asyncio.to_thread(self._count)
                    self._counted_at = time.monotonic()
        return self.queued


class Admission:
    """`await admission.admit(n, tenant=..., limits=...)` raises QueueFull or QuotaExceeded if
    `n` more queued jobs would be more than the fleet or the tenant may have; with `caller`,
    RateLimited if they would pass its key's cap on active jobs or its rate. Only once every
    check has passed is anything counted, or a token taken."""

    def __init__(self, reads: sessionmaker[Session], settings: Settings) -> None:
        self.max_queued_jobs = settings.max_queued_jobs
        self.defaults = Limits.defaults(settings)
        self._reads = reads
        self._fleet = _Count(self._counter(None))
        self._tenants: dict[str, _Count] = {}
        self._active: dict[str, _Count] = {}  # each tenant's queued and running jobs
        self._limits: dict[str, tuple[float, Limits]] = {}
        self.rates = RateLimiter(settings.broker_url)

    async def close(self) -> None:
        await self.rates.close()

    async def limits(self, tenant: str) -> Limits:
        """The tenant's limits (its own over the fleet's defaults), re-read every LIMITS_TTL_S."""
        hit = self._limits.get(tenant)
        if hit is not None and time.monotonic() - hit[0] < LIMITS_TTL_S:
            return hit[1]
        found = await asyncio.to_thread(self._read_limits, tenant)
        self._limits[tenant] = (time.monotonic(), found)
        return found

    async def admit(
        self,
        count: int,
        *,
        tenant: str,
        limits: Limits,
        caller: Caller | None = None,
        tokens: int | None = None,
    ) -> None:
        """`tokens`: what the request takes of its key's rate (`count`, a job's token each,
        unless given: a transform, one request of many jobs, takes one)."""
        cap = caller.limits.max_active_jobs if caller is not None else None
        if cap is not None:
            active = await self._active.setdefault(tenant, _Count(self._actives(tenant))).fresh()
            if active + count > cap:
                raise RateLimited(
                    f"key {caller.key_prefix if caller else ''} may have at most {cap} jobs queued "
                    f"or running (its tenant {tenant!r}'s, counted together): {active} are, and "
                    f"{count} more would exceed it; try again once some have ended"
                )
        if limits.max_queued_jobs > 0:
            mine = self._tenants.setdefault(tenant, _Count(self._counter(tenant)))
            queued = await mine.fresh()
            if queued + count > limits.max_queued_jobs:
                raise QuotaExceeded(
                    f"tenant {tenant!r} has {queued} jobs queued, and {count} more would exceed "
                    f"its quota of {limits.max_queued_jobs}; try again once some have run"
                )
        if self.max_queued_jobs > 0:
            queued = await self._fleet.fresh()
            if queued + count > self.max_queued_jobs:
                raise QueueFull(
                    f"the queue is full: {queued} jobs are queued and {count} more would "
                    f"exceed TFFLEET_MAX_QUEUED_JOBS={self.max_queued_jobs}; try again later"
                )
        if caller is not None:
            await self.rates.take(caller, count if tokens is None else tokens)
        if self.max_queued_jobs > 0:
            self._fleet.queued += count
        if limits.max_queued_jobs > 0:
            self._tenants[tenant].queued += count
        if cap is not None:
            self._active[tenant].queued += count

    def _counter(self, tenant: str | None) -> Callable[[], int]:
        def count() -> int:
            with self._reads() as session:
                return jobs.count_queued(session=session, tenant=tenant)

        return count

    def _actives(self, tenant: str) -> Callable[[], int]:
        def count() -> int:
            with self._reads() as session:
                return key_limits.count_active(session=session, tenant=tenant)

        return count

    def _read_limits(self, tenant: str) -> Limits:
        with self._reads() as session:
            return tenants.limits(session=session, name=tenant, defaults=self.defaults)
