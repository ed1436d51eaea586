"""The asyncio twin of `tffleet.client.Client`: the same methods, awaited.

    async with AsyncClient("http://127.0.0.1:8000") as client:
        outputs = await client.run("example", np.ones((1, 4), np.float32))

It performs the same plans (`tffleet.client.plans`) as the blocking client, so the two send
the same requests and read the answers the same way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

import httpx
import numpy as np

from tffleet.client import bulk, objects, plans, transforms, waiting
from tffleet.client.events import Follow
from tffleet.client.job import Job, ModelInfo
from tffleet.client.objects import DEFAULT_INLINE_MAX_BYTES
from tffleet.client.protocol import Call, Plan, Retries, build_request, connection
from tffleet.client.sync import DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_SIZE, DEFAULT_TIMEOUT_S
from tffleet.client.transform_handle import AsyncTransformHandle
from tffleet.client.transforms import Transform

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """An asyncio client. `transport` replaces the network (`httpx.ASGITransport(app)` serves
    an app in-process; `httpx.MockTransport` in tests)."""

    def __init__(
        self,
        url: str | httpx.URL | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        retries: Retries | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
        inline_max_bytes: int | None = DEFAULT_INLINE_MAX_BYTES,
    ) -> None:
        self._inline_max_bytes = inline_max_bytes
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._retries = retries or Retries()
        url, headers = connection(url, api_key, headers)
        self._http = httpx.AsyncClient(
            base_url=url, timeout=self._timeout, transport=transport, headers=headers
        )

    @property
    def url(self) -> httpx.URL:
        return self._http.base_url

    async def submit(
        self,
        model: str,
        inputs: Any,
        *,
        version: int | None = None,
        priority: int = 0,
        idempotency_key: str | None = None,
        cancel_after: float | str | timedelta | None = None,
        queue_timeout: float | str | timedelta | None = None,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
    ) -> Job:
        return await self._drive(
            plans.submit(
                model,
                inputs,
                version=version,
                priority=priority,
                idempotency_key=idempotency_key,
                retries=self._retries,
                cancel_after=cancel_after,
                queue_timeout=queue_timeout,
                webhook=webhook,
                webhook_events=webhook_events,
                inline_max_bytes=self._inline_max_bytes,
            )
        )

    async def submit_many(
        self,
        model: str,
        inputs_list: Iterable[Any],
        *,
        version: int | None = None,
        priority: int = 0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        idempotency_key: str | None = None,
        progress: bool | None = False,
        cancel_after: float | str | timedelta | None = None,
        queue_timeout: float | str | timedelta | None = None,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
    ) -> list[Job]:
        return await self._drive(
            bulk.submit_many(
                model,
                inputs_list,
                version=version,
                priority=priority,
                chunk_size=chunk_size,
                chunk_bytes=chunk_bytes,
                idempotency_key=idempotency_key,
                progress=progress,
                retries=self._retries,
                cancel_after=cancel_after,
                queue_timeout=queue_timeout,
                webhook=webhook,
                webhook_events=webhook_events,
                inline_max_bytes=self._inline_max_bytes,
            )
        )

    async def upload(
        self, array: np.ndarray | Mapping[str, np.ndarray], *, progress: bool | None = None
    ) -> str:
        """`Client.upload`: one array (or a dict of them, as an .npz) to the API's object
        store; returns its URI."""
        return await self._drive(objects.upload(array, retries=self._retries, progress=progress))

    async def get(self, job_id: str, *, encoding: str = "b64") -> Job:
        return await self._drive(
            waiting.get(job_id, encoding=encoding, wait_s=0, retries=self._retries)
        )

    async def get_many(self, job_ids: Sequence[str], *, encoding: str = "b64") -> list[Job]:
        return await self._drive(
            waiting.get_many(job_ids, encoding=encoding, wait_s=0, retries=self._retries)
        )

    async def wait(self, job_id: str, *, timeout: float | None = None) -> Job:
        return await self._drive(waiting.wait(job_id, timeout=timeout, retries=self._retries))

    async def wait_all(
        self,
        job_ids: Sequence[str],
        *,
        timeout: float | None = None,
        progress: bool | None = None,
    ) -> list[Job]:
        return await self._drive(
            waiting.wait_all(job_ids, timeout=timeout, progress=progress, retries=self._retries)
        )

    async def cancel(self, job_id: str) -> Job:
        return await self._drive(plans.cancel(job_id, retries=self._retries))

    async def retry(
        self,
        job_id: str,
        *,
        cancel_after: float | str | timedelta | None = None,
        queue_timeout: float | str | timedelta | None = None,
    ) -> Job:
        return await self._drive(
            plans.retry(
                job_id,
                cancel_after=cancel_after,
                queue_timeout=queue_timeout,
                retries=self._retries,
            )
        )

    async def delete(self, job_id: str) -> None:
        await self._drive(plans.delete(job_id, retries=self._retries))

    async def events(self, job_id: str, *, encoding: str = "b64") -> AsyncIterator[Job]:
        """`Client.events`: `async for job in client.events(job_id)`."""
        follow = Follow(job_id, encoding=encoding, retries=self._retries)
        timeout = follow.timeout(self._timeout)
        while not follow.ended:
            call = follow.call()
            request = build_request(self._http, call, timeout)
            try:
                response = await self._http.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        await response.aread()
                    if follow.opened(response):
                        async for line in response.aiter_lines():
                            if (job := follow.line(line)) is not None:
                                yield await self._drive(
                                    objects.fetch_outputs(job, retries=self._retries)
                                )
                finally:
                    await response.aclose()
            except httpx.RequestError as exc:
                await asyncio.sleep(follow.dropped(exc, call))
                continue
            if not follow.ended:
                await asyncio.sleep(follow.dropped(None, call))

    async def transform(
        self,
        model: str,
        input: str | Sequence[str],
        output: str | None = None,
        *,
        format: str | None = None,
        input_format: str | None = None,
        columns: Mapping[str, str] | None = None,
        key: str | None = None,
        version: int | None = None,
        shard_records: int | None = None,
        priority: int | None = None,
        webhook: str | None = None,
        webhook_events: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncTransformHandle:
        """`Client.transform`: a handle whose methods are awaited."""
        body = transforms.transform_body(
            model,
            input,
            output,
            format=format,
            input_format=input_format,
            columns=columns,
            key=key,
            version=version,
            shard_records=shard_records,
            priority=priority,
            webhook=webhook,
            webhook_events=webhook_events,
        )
        plan = transforms.create(body, idempotency_key=idempotency_key, retries=self._retries)
        return AsyncTransformHandle(self, await self._drive(plan))

    async def get_transform(self, transform_id: str) -> AsyncTransformHandle:
        """A handle on a transform made before (by id), as it is now."""
        plan = transforms.get(transform_id, wait_s=0, retries=self._retries)
        return AsyncTransformHandle(self, await self._drive(plan))

    async def transforms(
        self, *, status: str | None = None, model: str | None = None, limit: int = 100
    ) -> list[Transform]:
        """This key's tenant's transforms, newest first (`limit` at most)."""
        plan = transforms.list_transforms(
            status=status, model=model, limit=limit, retries=self._retries
        )
        return await self._drive(plan)

    async def put_dataset(
        self,
        source: str | os.PathLike[str] | bytes,
        path: str,
        *,
        overwrite: bool = False,
        progress: bool | None = None,
    ) -> str:
        """Put a file (a path, or bytes) into the fleet's store at `tffleet://datasets/<path>`
        for transforms to read; returns that URI. `Conflict` where a file is there already,
        unless `overwrite`. `progress`: a bar (None: for 64 MiB or more on a terminal)."""
        plan = transforms.put_dataset(
            source, path, overwrite=overwrite, progress=progress, retries=self._retries
        )
        return await self._drive(plan)

    async def webhook_secret(self) -> str:
        """The `whsec_...` secret that signs this key's tenant's webhooks."""
        return await self._drive(plans.webhook_secret(retries=self._retries))

    async def models(self) -> list[ModelInfo]:
        return await self._drive(plans.models(retries=self._retries))

    async def run(
        self,
        model: str,
        inputs: Any,
        *,
        version: int | None = None,
        priority: int = 0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        return await self._drive(
            plans.run(
                model,
                inputs,
                version=version,
                priority=priority,
                timeout=timeout,
                retries=self._retries,
                inline_max_bytes=self._inline_max_bytes,
            )
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _drive(self, plan: Plan[T]) -> T:
        """Perform what the plan asks, one step at a time, until it returns."""
        try:
            op = next(plan)
            while True:
                if isinstance(op, Call):
                    request = build_request(self._http, op, self._timeout)
                    try:
                        response = await self._http.send(request)
                    except httpx.RequestError as exc:
                        op = plan.throw(exc)
                        continue
                    op = plan.send(response)
                else:
                    await asyncio.sleep(op.seconds)
                    op = plan.send(None)
        except StopIteration as stop:
            result: T = stop.value
            return result
        finally:
            plan.close()
