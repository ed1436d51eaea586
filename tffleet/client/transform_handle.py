"""A transform bound to the client that made it: what `Client.transform` (and `AsyncClient`'s,
awaited) hands back.

    handle = client.transform("example", input="tffleet://datasets/rows.parquet")
    done = handle.wait(progress=True)          # a bar on records; the transform once ended
    table = handle.read()                      # its output parts as one pyarrow Table
    bad = handle.errors()                      # [{"index", "key", "reason"}] of bad records

Each method performs one plan of `tffleet.client.transforms` or `transform_files` on the
client's connection; `handle.transform` is the transform as last seen.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np

from tffleet.client import transform_files, transforms
from tffleet.client.protocol import Plan, Retries
from tffleet.client.transforms import Transform

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
D = TypeVar("D")


class _Driver(Protocol):
    _retries: Retries

    def _drive(self, plan: Plan[T]) -> T: ...


class _AsyncDriver(Protocol):
    _retries: Retries

    async def _drive(self, plan: Plan[T]) -> T: ...


class _Handle(Generic[D]):
    """What both handles are: the transform as last seen and the client (`D`, blocking or
    async) that follows it; only their methods differ, by an await."""

    def __init__(self, client: D, transform: Transform) -> None:
        self._client = client
        self.transform = transform

    @property
    def id(self) -> str:
        return self.transform.id

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.transform.status}>"


class TransformHandle(_Handle[_Driver]):
    """A transform and the blocking client that follows it."""

    def status(self) -> Transform:
        """The transform now (its counts, progress, ETA)."""
        self.transform = self._client._drive(
            transforms.get(self.id, wait_s=0, retries=self._client._retries)
        )
        return self.transform

    def wait(self, *, timeout: float | None = None, progress: bool | None = None) -> Transform:
        """The transform once it has ended (succeeded, failed or canceled: look at `.status`);
        `TransformWaitTimeout` if `timeout` seconds pass first. `progress`: a bar on records
        (None: when stderr is a terminal)."""
        self.transform = self._client._drive(
            transforms.wait(
                self.id, timeout=timeout, progress=progress, retries=self._client._retries
            )
        )
        return self.transform

    def cancel(self) -> Transform:
        """Cancel it: queued shards never start, running ones stop at a batch boundary."""
        plan = transforms.cancel(self.id, retries=self._client._retries)
        self.transform = self._client._drive(plan)
        return self.transform

    def retry(self) -> Transform:
        """Run its failed shards again (only those: finished shards keep their parts)."""
        plan = transforms.retry(self.id, retries=self._client._retries)
        self.transform = self._client._drive(plan)
        return self.transform

    def files(self) -> list[dict[str, str]]:
        """The files it wrote so far, `[{"name", "kind"}]` (kind `part` or `errors`)."""
        return self._client._drive(
            transform_files.list_files(self.id, retries=self._client._retries)
        )

    def read(self) -> pa.Table:
        """Its output parts as one pyarrow Table, records in input order (bad ones left out:
        see `errors`)."""
        return transform_files.read_table(self.transform.output_format, self._parts("part"))

    def arrays(self) -> dict[str, np.ndarray]:
        """Its output parts as NumPy arrays by column (an .npy output: `{"output": array}`)."""
        return transform_files.read_arrays(self.transform.output_format, self._parts("part"))

    def errors(self) -> list[dict[str, Any]]:
        """Its bad records, `{"index", "key", "reason"}` each, in input order."""
        return transform_files.read_errors(self._parts("errors"))

    def download(self, folder: str | os.PathLike[str]) -> list[Path]:
        """Save every file it wrote (parts, errors/...) into `folder`; returns their paths."""
        saved: list[Path] = []
        for file in self.files():
            plan = transform_files.fetch(self.id, file["name"], retries=self._client._retries)
            saved.append(transform_files.save(folder, file["name"], self._client._drive(plan)))
        return saved

    def _parts(self, kind: str) -> list[bytes]:
        return self._client._drive(
            transform_files.fetch_kind(self.id, kind, retries=self._client._retries)
        )


class AsyncTransformHandle(_Handle[_AsyncDriver]):
    """`TransformHandle` for `AsyncClient`: the same methods, awaited."""

    async def status(self) -> Transform:
        plan = transforms.get(self.id, wait_s=0, retries=self._client._retries)
        self.transform = await self._client._drive(plan)
        return self.transform

    async def wait(
        self, *, timeout: float | None = None, progress: bool | None = None
    ) -> Transform:
        plan = transforms.wait(
            self.id, timeout=timeout, progress=progress, retries=self._client._retries
        )
        self.transform = await self._client._drive(plan)
        return self.transform

    async def cancel(self) -> Transform:
        plan = transforms.cancel(self.id, retries=self._client._retries)
        self.transform = await self._client._drive(plan)
        return self.transform

    async def retry(self) -> Transform:
        plan = transforms.retry(self.id, retries=self._client._retries)
        self.transform = await self._client._drive(plan)
        return self.transform

    async def files(self) -> list[dict[str, str]]:
        return await self._client._drive(
            transform_files.list_files(self.id, retries=self._client._retries)
        )

    async def read(self) -> pa.Table:
        parts = await self._parts("part")
        return transform_files.read_table(self.transform.output_format, parts)

    async def arrays(self) -> dict[str, np.ndarray]:
        parts = await self._parts("part")
        return transform_files.read_arrays(self.transform.output_format, parts)

    async def errors(self) -> list[dict[str, Any]]:
        return transform_files.read_errors(await self._parts("errors"))

    async def download(self, folder: str | os.PathLike[str]) -> list[Path]:
        saved: list[Path] = []
        for file in await self.files():
            plan = transform_files.fetch(self.id, file["name"], retries=self._client._retries)
            saved.append(
                transform_files.save(folder, file["name"], await self._client._drive(plan))
            )
        return saved

    async def _parts(self, kind: str) -> list[bytes]:
        return await self._client._drive(
            transform_files.fetch_kind(self.id, kind, retries=self._client._retries)
        )
