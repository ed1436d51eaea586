"""Admission: submissions are refused (429) while the queue holds `max_queued_jobs` jobs."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from tffleet.errors import QueueFull

# The queued count is read at most this often: a count per submit would cost more than the insert.
COUNT_TTL_S = 0.5


class QueueLimit:
    """`await limit.admit(n)` raises QueueFull if n more jobs would exceed the limit.

    Between two counts it adds up what it admitted, so a burst cannot overshoot by much more
    than what other API processes admit within `COUNT_TTL_S`.
    """

    def __init__(self, reads: sessionmaker[Session], *, max_queued_jobs: int) -> None:
        self.max_queued_jobs = max_queued_jobs
        self._reads = reads
        self._lock = asyncio.Lock()
        self._counted_at = -float("inf")
        self._queued = 0  # at the last count, plus what was admitted since

    async def admit(self, count: int) -> None:
        if self.max_queued_jobs <= 0:
            return
        if time.monotonic() - self._counted_at >= COUNT_TTL_S:
            async with self._lock:  # one count for all the requests that find it stale
                if time.monotonic() - self._counted_at >= COUNT_TTL_S:
                    self._queued = await asyncio.to_thread(self._count)
                    self._counted_at = time.monotonic()
        if self._queued + count > self.max_queued_jobs:
            raise QueueFull(
                f"the queue is full: {self._queued} jobs are queued and {count} more would "
                f"exceed TFFLEET_MAX_QUEUED_JOBS={self.max_queued_jobs}; try again later"
            )
        self._queued += count

    def _count(self) -> int:
        with self._reads() as session:
            return jobs.count_queued(session=session)
