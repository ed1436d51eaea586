"""A stream into a directory store, written without obstore (tffleet/objectstore/files.py): the
same object obstore would have written, and nothing on disk when it fails or is cancelled."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tffleet.objectstore import ObjectStore, StoreUnavailable, files, open_store

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "objects"


@pytest.fixture
def store(root: Path) -> ObjectStore:
    return open_store(root.as_uri())


def on_disk(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


async def chunks_of(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def test_chunks_of_every_size_are_written_whole_and_read_back_by_obstore(
    store: ObjectStore, root: Path
) -> None:
    body = os.urandom(3 * files.BATCH_BYTES + 4321)
    # More tiny chunks than one writev takes, then chunks larger than a batch.
    tiny = body[:3000]
    assert await store.put_stream_async("t/jobs/j1/inputs/x.npy", chunks_of(tiny, 1)) == 3000
    assert await store.put_stream_async("t/big.npy", chunks_of(body, 3 << 20)) == len(body)

    assert bytes(store.get("t/jobs/j1/inputs/x.npy")) == tiny
    assert bytes(store.get("t/big.npy")) == body
    assert sorted(store.keys("t/")) == ["t/big.npy", "t/jobs/j1/inputs/x.npy"]
    assert on_disk(root) == ["t/big.npy", "t/jobs/j1/inputs/x.npy"]  # no staging file left


async def test_a_stream_written_again_replaces_the_object(store: ObjectStore) -> None:
    await store.put_stream_async("t/x.npy", chunks_of(b"first", 2))
    await store.put_stream_async("t/x.npy", chunks_of(b"second", 2))
    assert bytes(store.get("t/x.npy")) == b"second"


async def test_a_failing_stream_leaves_nothing_on_disk(store: ObjectStore, root: Path) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * (files.BATCH_BYTES + 1)  # one batch written already
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await store.put_stream_async("t/half.npy", chunks())
    assert store.size("t/half.npy") is None
    assert on_disk(root) == []


async def test_a_cancelled_stream_leaves_nothing_on_disk(store: ObjectStore, root: Path) -> None:
    arrived = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * (files.BATCH_BYTES + 1)
        arrived.set()
        await asyncio.Event().wait()  # a client that sends no more
        yield b""

    task = asyncio.create_task(store.put_stream_async("t/stuck.npy", chunks()))
    await arrived.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert on_disk(root) == []


async def test_a_key_the_directory_store_escapes_goes_through_obstore(store: ObjectStore) -> None:
    assert not files.plain("t/a b.npy") and not files.plain("t/../x.npy")
    assert await store.put_stream_async("t/a b.npy", chunks_of(b"spaced", 4)) == 6
    assert bytes(store.get("t/a b.npy")) == b"spaced"


async def test_a_file_system_that_refuses_is_store_unavailable(
    store: ObjectStore, root: Path
) -> None:
    (root / "t").write_bytes(b"a file where a folder must go")
    with pytest.raises(StoreUnavailable):
        await store.put_stream_async("t/x.npy", chunks_of(b"data", 2))
