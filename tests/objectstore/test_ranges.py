"""Ranged reads (`ObjectStore.get_range`, `get_range_async`): the bytes of one run of an object,
one request, as a buffer numpy wraps without a copy; over a directory and a real S3 server."""

from __future__ import annotations

import numpy as np
import pytest

from tests.objectstore.conftest import dead_store
from tffleet import tensors
from tffleet.objectstore import ObjectMissing, ObjectStore, StoreUnavailable

pytestmark = pytest.mark.anyio

DATA = bytes(range(256)) * 64  # 16 KiB


@pytest.fixture
def anyio_backend() -> str:
    """obstore's async calls run on asyncio's loop (the API's)."""
    return "asyncio"


def test_a_range_is_those_bytes_alone(object_store: ObjectStore) -> None:
    object_store.put("r/data.bin", DATA)
    for start, end in [(0, 1), (100, 5000), (len(DATA) - 7, len(DATA)), (0, len(DATA))]:
        found = object_store.get_range("r/data.bin", start, end)
        assert isinstance(found, memoryview) and found.readonly
        assert bytes(found) == DATA[start:end]


async def test_the_async_range_reads_what_the_sync_one_does(object_store: ObjectStore) -> None:
    object_store.put("r/data.bin", DATA)
    found = await object_store.get_range_async("r/data.bin", 300, 9000)
    assert bytes(found) == DATA[300:9000] == bytes(object_store.get_range("r/data.bin", 300, 9000))


def test_rows_of_an_npy_read_as_a_view_of_the_range(object_store: ObjectStore) -> None:
    x = np.arange(60, dtype=np.float32).reshape(10, 6)
    data = tensors.write_npy(x)
    object_store.put("r/x.npy", data)
    header = len(data) - x.nbytes
    row = x.itemsize * 6
    found = object_store.get_range("r/x.npy", header + 4 * row, header + 8 * row)
    rows = np.frombuffer(found, dtype=np.float32).reshape(4, 6)
    assert np.shares_memory(rows, np.frombuffer(found, dtype=np.uint8)), "no copy"
    np.testing.assert_array_equal(rows, x[4:8])


async def test_a_range_of_a_missing_object_is_object_missing(object_store: ObjectStore) -> None:
    with pytest.raises(ObjectMissing):
        object_store.get_range("r/none.bin", 0, 10)
    with pytest.raises(ObjectMissing):
        await object_store.get_range_async("r/none.bin", 0, 10)


async def test_a_range_from_a_store_that_answers_nothing_is_store_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = dead_store(monkeypatch)
    with pytest.raises(StoreUnavailable):
        store.get_range("k", 0, 10)
    with pytest.raises(StoreUnavailable):
        await store.get_range_async("k", 0, 10)
