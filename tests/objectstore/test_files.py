"""A stream into a directory store, written without obstore (tffleet/objectstore/files.py): the
same object obstore would have written, and nothing on disk when it fails or is cancelled; and
its objects read back without obstore, the big ones as memory maps."""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from tffleet import tensors
from tffleet.objectstore import ObjectMissing, ObjectStore, StoreUnavailable, files, open_store

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


def test_a_big_object_is_read_as_a_map_of_its_file_that_outlives_its_deletion(
    store: ObjectStore,
) -> None:
    array = np.arange(files.MAP_MIN_BYTES // 4 * 3, dtype=np.float32).reshape(-1, 3)
    data, reference = tensors.npy_object("t/jobs/j/inputs/x.npy", array)
    store.put(reference.key, data)
    whole = store.get(reference.key)
    assert isinstance(whole.obj, mmap.mmap)
    viewed = tensors.unpack(tensors.pack({}, {"x": reference}), {reference.key: whole})["x"]
    assert np.array_equal(viewed, array) and np.shares_memory(viewed, np.asarray(whole))
    # The data starts 64-byte aligned, as the page the map starts on and the .npy header make it.
    assert viewed.ctypes.data % 64 == 0
    rows = store.get_range(reference.key, reference.offset + 12, len(data))  # all but a row
    assert isinstance(rows.obj, mmap.mmap)
    assert np.array_equal(np.frombuffer(rows, dtype=np.float32), array[1:].ravel())
    header = store.get_range(reference.key, 0, reference.offset)  # a few bytes: read
    assert isinstance(header.obj, bytes) and bytes(header) == data[: reference.offset]
    # Private: a write into the map (TensorFlow's, into memory it took) never reaches the file.
    np.frombuffer(whole, dtype=np.uint8)[reference.offset :] = 0
    assert np.array_equal(
        tensors.unpack(
            tensors.pack({}, {"x": reference}), {reference.key: store.get(reference.key)}
        )["x"],
        array,
    )
    store.delete([reference.key])  # a map reads on after the file is gone
    assert not np.frombuffer(whole, dtype=np.uint8)[reference.offset :].any()
    with pytest.raises(ObjectMissing):
        store.get(reference.key)


def test_a_small_object_is_read_and_a_range_past_the_end_ends_there(store: ObjectStore) -> None:
    store.put("t/small.bin", b"0123456789")
    assert bytes(store.get("t/small.bin")) == b"0123456789"
    assert bytes(store.get_range("t/small.bin", 4, 100)) == b"456789"
    assert bytes(store.get_range("t/small.bin", 20, 30)) == b""
    big = bytes(range(256)) * (files.MAP_MIN_BYTES // 256 + 1)
    store.put("t/big.bin", big)
    assert bytes(store.get_range("t/big.bin", len(big) - 3, len(big) + 10)) == big[-3:]
    with pytest.raises(ObjectMissing):
        store.get_range("t/none.bin", 0, 1)


def test_an_object_that_cannot_be_mapped_is_read(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = bytes(range(256)) * (files.MAP_MIN_BYTES // 256)

    def no_map(*args: object, **kwargs: object) -> mmap.mmap:
        raise OSError(errno.ENODEV, "No such device")  # a file system that maps nothing

    store.put("t/big.bin", big)
    monkeypatch.setattr(files.mmap, "mmap", no_map)
    read = store.get("t/big.bin")
    assert isinstance(read.obj, bytes) and bytes(read) == big
    assert bytes(store.get_range("t/big.bin", 10, 20)) == big[10:20]


def test_past_max_maps_live_at_once_objects_are_read_until_a_map_is_let_go(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "MAX_MAPS", files._maps + 2)  # what other tests hold, and two
    big = bytes(range(256)) * (files.MAP_MIN_BYTES // 256)
    store.put("t/big.bin", big)
    held = [store.get("t/big.bin"), store.get_range("t/big.bin", 0, len(big))]
    assert all(isinstance(view.obj, mmap.mmap) for view in held)
    third = store.get("t/big.bin")  # two maps live: its descriptors are kept for the rest
    assert isinstance(third.obj, bytes) and bytes(third) == big
    held.pop()  # a map let go (its last buffer dropped)
    assert isinstance(store.get("t/big.bin").obj, mmap.mmap)
