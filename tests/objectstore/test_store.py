"""The object store's calls, on both kinds: a directory and a real S3 server (SeaweedFS).

Each test runs twice (`object_store` is a directory, then a fresh prefix of the run's bucket), so
the two kinds are held to the same contract: what the API and the worker code against.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from tests.objectstore.conftest import dead_store
from tests.services import PrivateSeaweed
from tffleet.objectstore import ObjectMissing, ObjectStore, StoreUnavailable, open_store
from tffleet.objectstore.store import PART_BYTES

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """obstore's async calls run on asyncio's loop (the API's), not trio's."""
    return "asyncio"


def npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_put_get_size_delete(object_store: ObjectStore) -> None:
    object_store.put("default/uploads/a.npy", b"hello")
    assert bytes(object_store.get("default/uploads/a.npy")) == b"hello"
    assert object_store.size("default/uploads/a.npy") == 5

    object_store.delete(["default/uploads/a.npy"])
    assert object_store.size("default/uploads/a.npy") is None
    with pytest.raises(ObjectMissing):
        object_store.get("default/uploads/a.npy")


async def test_the_async_calls_do_what_the_sync_ones_do(object_store: ObjectStore) -> None:
    await object_store.put_async("t/jobs/j/inputs/x.npy", memoryview(b"abc"))
    assert bytes(await object_store.get_async("t/jobs/j/inputs/x.npy")) == b"abc"
    assert await object_store.size_async("t/jobs/j/inputs/x.npy") == 3
    await object_store.delete_async(["t/jobs/j/inputs/x.npy"])
    assert await object_store.size_async("t/jobs/j/inputs/x.npy") is None


def test_get_returns_a_buffer_numpy_wraps_without_a_copy(object_store: ObjectStore) -> None:
    array = np.arange(1000, dtype=np.float32)
    object_store.put("t/a.npy", array.tobytes())
    buffer = object_store.get("t/a.npy")
    wrapped = np.frombuffer(buffer, dtype=np.float32)
    assert np.array_equal(wrapped, array)
    # The array's memory is the bytes read (an `obstore.Bytes`, a directory's own), not a copy.
    assert not wrapped.flags.owndata
    assert np.shares_memory(wrapped, np.frombuffer(buffer.obj, dtype=np.uint8))


def test_a_missing_key_is_object_missing_and_deleting_it_is_fine(object_store: ObjectStore) -> None:
    with pytest.raises(ObjectMissing):
        object_store.get("t/none.npy")
    assert object_store.size("t/none.npy") is None
    object_store.put("t/some.npy", b"1")
    object_store.delete(["t/none.npy", "t/some.npy", "t/other-none.npy"])  # no error
    object_store.delete([])
    assert object_store.total_bytes("t/") == (0, 0)


async def test_read_prefix_reads_the_header_only(object_store: ObjectStore) -> None:
    body = npy(np.zeros((64, 64), dtype=np.float32))
    object_store.put("t/x.npy", body)
    assert await object_store.read_prefix_async("t/x.npy", 128) == body[:128]
    assert await object_store.read_prefix_async("t/x.npy", 10**9) == body  # past its end: all
    with pytest.raises(ObjectMissing):
        await object_store.read_prefix_async("t/none.npy", 128)


async def test_a_stream_of_20_mb_in_chunks_is_written_in_parts_and_reads_back_equal(
    object_store: ObjectStore,
) -> None:
    rng = np.random.default_rng(0)
    body = rng.integers(0, 256, size=20 * 1024 * 1024 + 12345, dtype=np.uint8).tobytes()
    assert len(body) > 2 * PART_BYTES  # several parts on S3

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    assert await object_store.put_stream_async("t/big.npy", chunks()) == len(body)
    assert object_store.size("t/big.npy") == len(body)
    assert bytes(object_store.get("t/big.npy")) == body
    streamed = [chunk async for chunk in object_store.stream_async("t/big.npy")]
    assert b"".join(streamed) == body
    assert len(streamed) > 1


async def test_a_stream_that_fails_leaves_no_object(object_store: ObjectStore) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 1000
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await object_store.put_stream_async("t/half.npy", chunks())
    assert object_store.size("t/half.npy") is None


async def test_stream_of_a_missing_key_fails_before_any_byte(object_store: ObjectStore) -> None:
    stream = object_store.stream_async("t/none.npy")
    with pytest.raises(ObjectMissing):
        await anext(stream)


def test_total_bytes_counts_objects_under_a_prefix(object_store: ObjectStore) -> None:
    object_store.put("a/jobs/1/inputs/x.npy", b"12345")
    object_store.put("a/jobs/1/outputs/y.npy", b"123")
    object_store.put("b/uploads/u.npy", b"1")
    assert object_store.total_bytes("a/") == (2, 8)
    assert object_store.total_bytes("b/") == (1, 1)
    assert object_store.total_bytes() == (3, 9)


@pytest.mark.parametrize("object_store_url", ["s3"], indirect=True)
def test_a_presigned_put_stores_bytes_that_never_pass_through_us(object_store: ObjectStore) -> None:
    assert object_store.presigns
    url = object_store.presign_put("t/uploads/p.npy", expires_s=60)
    assert httpx.put(url, content=b"straight to S3").status_code == 200
    assert bytes(object_store.get("t/uploads/p.npy")) == b"straight to S3"

    got = httpx.get(object_store.presign_get("t/uploads/p.npy", expires_s=60))
    assert got.status_code == 200 and got.content == b"straight to S3"
    # The URL is for that key only: another key under it is refused.
    assert httpx.put(url.replace("p.npy", "q.npy", 1), content=b"x").status_code == 403


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_a_directory_store_hands_out_no_presigned_urls(object_store: ObjectStore) -> None:
    assert not object_store.presigns
    with pytest.raises(ValueError, match="no presigned URLs"):
        object_store.presign_put("t/uploads/p.npy", expires_s=60)
    with pytest.raises(ValueError, match="no presigned URLs"):
        object_store.presign_get("t/uploads/p.npy", expires_s=60)


async def test_an_s3_endpoint_that_answers_nothing_is_store_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = dead_store(monkeypatch)
    for call in (lambda: store.put("k", b"1"), lambda: store.get("k"), lambda: store.size("k")):
        with pytest.raises(StoreUnavailable, match="object store"):
            call()
    with pytest.raises(StoreUnavailable):
        await store.put_async("k", b"1")
    with pytest.raises(StoreUnavailable):
        store.delete(["k"])
    with pytest.raises(StoreUnavailable):
        store.total_bytes()
    assert StoreUnavailable.code == "object_store_unavailable"


def test_wrong_credentials_are_store_unavailable_not_missing(
    seaweed: PrivateSeaweed, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = open_store("s3://tffleet-test/x", retry_s=0.2)
    with pytest.raises(StoreUnavailable):
        store.put("k", b"1")
    with pytest.raises(StoreUnavailable):
        store.get("k")


def test_a_directory_store_is_made_when_missing(tmp_path: pytest.TempPathFactory) -> None:
    directory = tmp_path / "a" / "b"  # type: ignore[operator]
    store = open_store(directory.as_uri())
    store.put("t/x.npy", b"1")
    assert (directory / "t" / "x.npy").read_bytes() == b"1"
