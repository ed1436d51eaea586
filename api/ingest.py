"""Group commit and coalesced wake-ups for submissions.

Submissions that arrive while the previous flush is being written wait for the next one, so under
load many jobs share one transaction and one broker message per model version, and at idle a job
is written at once. A flush commits, answers its requests, then publishes: a wake-up never names a
row that is not committed, and a publish that fails leaves the jobs `queued` for the sweeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from api.metrics import JOBS_SUBMITTED, PUBLISH_FAILURES
from api.publish import Publisher
from api.schemas import job_out
from db import jobs

log = logging.getLogger(__name__)


@dataclass
class _Request:
    jobs: Sequence[jobs.NewJob]
    done: asyncio.Future[list[dict[str, Any]]]


class Ingestor:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        publisher: Publisher,
        *,
        max_jobs_per_flush: int = 2048,
    ) -> None:
        self._sessions = sessions
        self._publisher = publisher
        self._max_jobs = max_jobs_per_flush
        self._pending: list[_Request] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ingestor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for request in self._pending:
            if not request.done.done():
                request.done.set_exception(RuntimeError("the API is shutting down"))

    async def submit(self, new_jobs: Sequence[jobs.NewJob]) -> list[dict[str, Any]]:
        """Store the jobs (all or none) and return them as the API shows them."""
        request = _Request(new_jobs, asyncio.get_running_loop().create_future())
        self._pending.append(request)
        self._wake.set()
        return await request.done

    def _take(self) -> list[_Request]:
        taken: list[_Request] = []
        count = 0
        while self._pending and (not taken or count + len(self._pending[0].jobs) <= self._max_jobs):
            request = self._pending.pop(0)
            taken.append(request)
            count += len(request.jobs)
        return taken

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while batch := self._take():
                await self._flush(batch)

    async def _flush(self, batch: list[_Request]) -> None:
        try:
            outs = await asyncio.to_thread(self._write, batch)
        except Exception as exc:
            for request in batch:
                if not request.done.done():
                    request.done.set_exception(exc)
            return
        wake: defaultdict[tuple[str, int], list[str]] = defaultdict(list)
        for request, out in zip(batch, outs, strict=True):
            if not request.done.done():
                request.done.set_result(out)
            for job in out:
                wake[(job["model"], job["version"])].append(job["id"])
        for (model, _), ids in wake.items():
            JOBS_SUBMITTED.labels(model=model).inc(len(ids))
        await asyncio.to_thread(self._publish, wake)

    def _write(self, batch: list[_Request]) -> list[list[dict[str, Any]]]:
        with self._sessions.begin() as session:
            created = jobs.create(session=session, jobs=[j for r in batch for j in r.jobs])
            outs = [job_out(job, with_outputs=False) for job in created]
        result, start = [], 0
        for request in batch:
            result.append(outs[start : start + len(request.jobs)])
            start += len(request.jobs)
        return result

    def _publish(self, wake: dict[tuple[str, int], list[str]]) -> None:
        for (model, version), ids in wake.items():
            if not self._publisher.publish(model=model, version=version, job_ids=ids):
                PUBLISH_FAILURES.inc()
