"""Coalescing: callers that arrive while a batch is in flight share the next one.

One background task drains the requests that have piled up and hands them, all at once, to a
function run in a worker thread: one database round trip for many HTTP requests under load, and
no added wait at idle (a lone request is handled at once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class Coalescer(Generic[In, Out]):
    def __init__(
        self,
        # Given every waiting request, returns per request a result or the exception to raise.
        handle: Callable[[Sequence[In]], Sequence[Out | BaseException]],
        *,
        name: str,
        max_batch: int = 1024,
        size: Callable[[In], int] = lambda _: 1,
    ) -> None:
        self._handle = handle
        self._name = name
        self._max_batch = max_batch
        self._size = size
        self._pending: list[tuple[In, asyncio.Future[Out]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for _, future in self._pending:
            if not future.done():
                future.set_exception(RuntimeError(f"{self._name} is shutting down"))

    async def __call__(self, item: In) -> Out:
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._wake.set()
        return await future

    def _take(self) -> list[tuple[In, asyncio.Future[Out]]]:
        taken: list[tuple[In, asyncio.Future[Out]]] = []
        total = 0
        while self._pending:
            size = self._size(self._pending[0][0])
            if taken and total + size > self._max_batch:
                break
            taken.append(self._pending.pop(0))
            total += size
        return taken

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while batch := self._take():
                await self._process(batch)

    async def _process(self, batch: list[tuple[In, asyncio.Future[Out]]]) -> None:
        items = [item for item, _ in batch]
        try:
            outcomes: Sequence[Out | BaseException] = await asyncio.to_thread(self._handle, items)
        except Exception as exc:  # the whole batch failed (the database is down, say)
            outcomes = [exc] * len(batch)
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # the caller went away (client disconnected)
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
