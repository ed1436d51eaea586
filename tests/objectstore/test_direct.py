"""A directory store's big objects go straight to the disk (O_DIRECT, tffleet/objectstore/direct.py
`Direct`): written whole and exact whatever their size, where the file system takes direct I/O
and where it does not, and a small object through the page cache as before."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tffleet.objectstore import direct, files, open_store

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="direct I/O is Linux's"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every file the store module opens, with the flags asked for (a seam: the real call runs)."""
    seen: list[tuple[str, int]] = []
    real = os.open

    def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        seen.append((str(path), flags))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", spy)
    return seen


def direct_asked(opened: list[tuple[str, int]]) -> list[bool]:
    """For each staging file opened for writing, in order: whether O_DIRECT was asked for
    (first: an open that found no folder is tried again, the same way, once it is made)."""
    first: dict[str, int] = {}
    for path, flags in opened:
        if "#" in path:
            first.setdefault(path, flags)
    return [bool(flags & os.O_DIRECT) for flags in first.values()]


async def chunks_of(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


# Sizes around the buffer's and the block's edges: under a block past a batch, whole batches,
# a byte over one.
SIZES = [files.BATCH_BYTES + 1, 2 * files.BATCH_BYTES, 3 * files.BATCH_BYTES + 4321]


@pytest.mark.parametrize("size", SIZES)
async def test_a_big_stream_or_put_is_written_directly_and_reads_back_exact(
    tmp_path: Path, opened: list[tuple[str, int]], size: int
) -> None:
    store = open_store((tmp_path / "objects").as_uri())
    body = os.urandom(size)
    assert await store.put_stream_async("t/streamed.npy", chunks_of(body, 256_000)) == size
    store.put("t/put.npy", body)
    await store.put_async("t/put_async.npy", memoryview(body))

    assert direct_asked(opened) == [True, True, True]
    for key in ("t/streamed.npy", "t/put.npy", "t/put_async.npy"):
        assert store.size(key) == size  # cut to its size: no padding of the last block
        assert bytes(store.get(key)) == body
    assert sorted(p.name for p in (tmp_path / "objects" / "t").iterdir()) == [
        "put.npy",
        "put_async.npy",
        "streamed.npy",
    ]  # no staging file left


async def test_a_small_object_goes_through_the_page_cache(
    tmp_path: Path, opened: list[tuple[str, int]]
) -> None:
    store = open_store((tmp_path / "objects").as_uri())
    small = os.urandom(files.BATCH_BYTES - 1)
    await store.put_stream_async("t/a.npy", chunks_of(small, 65536))
    store.put("t/b.npy", small)
    assert direct_asked(opened) == [False, False]
    assert bytes(store.get("t/a.npy")) == bytes(store.get("t/b.npy")) == small


def test_an_array_of_any_shape_is_put_by_its_bytes(tmp_path: Path) -> None:
    store = open_store((tmp_path / "objects").as_uri())
    array = np.arange(3 * files.BATCH_BYTES // 4, dtype=np.float32).reshape(-1, 6)
    store.put("t/array.bin", array.data)
    assert bytes(store.get("t/array.bin")) == array.tobytes()


async def test_a_file_system_that_refuses_direct_io_gets_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.open
    asked: list[bool] = []

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if "#" in str(path):
            asked.append(bool(flags & os.O_DIRECT))
            if flags & os.O_DIRECT:  # as tmpfs before Linux 6.6 answers, and others
                raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", open_)
    (tmp_path / "objects" / "t").mkdir(parents=True)
    store = open_store((tmp_path / "objects").as_uri())
    body = os.urandom(files.BATCH_BYTES + 4321)
    assert await store.put_stream_async("t/x.npy", chunks_of(body, 100_000)) == len(body)
    assert asked == [True, False]
    assert bytes(store.get("t/x.npy")) == body


def test_a_device_that_refuses_a_direct_write_gets_the_rest_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.write
    refused: list[int] = []

    def write(fd: int, data: Any) -> int:
        if not refused and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(direct.os, "write", write)
    store = open_store((tmp_path / "objects").as_uri())
    body = os.urandom(2 * files.BATCH_BYTES + 77)
    store.put("t/x.npy", body)
    assert refused and bytes(store.get("t/x.npy")) == body


def test_the_aligned_buffers_kept_stay_few(tmp_path: Path) -> None:
    store = open_store((tmp_path / "objects").as_uri())
    body = os.urandom(files.BATCH_BYTES + 1)
    for i in range(direct._KEPT_BUFFERS + 2):
        store.put(f"t/{i}.npy", body)
    assert len(direct._buffers) <= direct._KEPT_BUFFERS
