"""The object store beside the database, where tensors too big for a SQL row live (DESIGN §13).

`open_store(url)` gives an `ObjectStore` over `file:///dir` (a directory: the embedded default,
under `tffleet up`'s data directory) or `s3://bucket/prefix` on any S3-compatible service, whose
endpoint and credentials come the usual AWS way (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, or an instance role).

It is a thin layer over obstore (the Python binding of Apache Arrow's `object_store` crate), chosen
over boto3 and s3fs because one library gives both stores the same calls, sync (the worker's
threads) and async (the API's event loop), multipart writes of a stream, presigned URLs, and
reads returned as buffers that numpy wraps without a copy (`obstore.Bytes`). Its async calls run
on asyncio's event loop (the API's), not trio's.

Every failure comes out as one of two errors: `ObjectMissing` (no object under that key) and
`StoreUnavailable` (anything else: the service down, refused credentials, a full disk). Callers
answer the first for what it is (a 422, a failed job) and the second as "try again" (a 503, a
job left queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import obstore
from obstore.exceptions import BaseError, NotFoundError
from obstore.store import LocalStore, S3Store

from tffleet.errors import ServiceUnavailable
from tffleet.objectstore import files
from tffleet.objectstore.urls import parse_store_url

# How long an S3 call may take to connect, and at most in all (a body of a GB included); a
# failed call is tried again with a back-off for at most RETRY_S before StoreUnavailable.
CONNECT_TIMEOUT_S = 5
REQUEST_TIMEOUT_S = 600
RETRY_S = 10
# The part size of multipart writes: S3's least is 5 MiB.
PART_BYTES = 8 * 1024 * 1024


class ObjectMissing(LookupError):
    """No object under the key: deleted, expired, or never written."""


class StoreUnavailable(ServiceUnavailable):
    """The object store did not do what was asked (down, refused, full): try again later."""

    code = "object_store_unavailable"


@contextmanager
def _translated(key: str) -> Iterator[None]:
    try:
        yield
    except (FileNotFoundError, NotFoundError):
        raise ObjectMissing(key) from None
    except (BaseError, OSError) as exc:
        raise _unavailable(exc) from exc


class _SourceFailed(Exception):
    """The chunks written failed: carries their error past `_translated`, which would take an
    OSError (a reset connection) for the store's."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def _source(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    iterator = aiter(chunks)
    while True:
        try:
            chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except Exception as exc:
            raise _SourceFailed(exc) from exc
        yield chunk


class _ReadableSource:
    """A `files.Readable` whose own errors come out as _SourceFailed, as `_source`'s do."""

    def __init__(self, body: files.Readable) -> None:
        self._body = body
        self.size = body.size

    def readable(self) -> bool:
        return self._body.readable()

    async def readinto(self, buffer: memoryview) -> int:
        try:
            return await self._body.readinto(buffer)
        except Exception as exc:
            raise _SourceFailed(exc) from exc

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _source(self._body)


def _unavailable(exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"object store: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


class ObjectStore:
    """Objects under string keys ("tenant/uploads/<id>.npy"), in one store; see the module
    docstring. `url` is as configured (it holds no credentials: they come from the environment)."""

    def __init__(
        self, url: str, store: Any, *, presigns: bool, directory: Path | None = None
    ) -> None:
        self.url = url
        self._store = store
        self.presigns = presigns  # S3 can hand out presigned URLs; a directory cannot
        # A directory store's root: streams are written into it directly (`_stream_to_file`).
        self._directory = directory

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    # ─── Writes ─────────────────────────────────────────────────────────────────────────────────

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write the object whole. A directory store's is written without obstore, a big one
        straight to the disk (tffleet/objectstore/files.py)."""
        if self._directory is not None and files.plain(key):
            try:
                files.write(self._directory / key, data)
            except OSError as exc:
                raise _unavailable(exc) from exc
            return
        with _translated(key):
            obstore.put(self._store, key, data)

    async def put_async(self, key: str, data: bytes | memoryview) -> None:
        if self._directory is not None and files.plain(key):
            await asyncio.to_thread(self.put, key, data)
            return
        with _translated(key):
            await obstore.put_async(self._store, key, data)

    async def put_stream_async(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        """Write the chunks as they come (a multipart upload on S3: nothing is held whole);
        returns the bytes written. An error leaves no object under the key. A directory
        store's is written without obstore (tffleet/objectstore/files.py: a third of the CPU)."""
        try:
            if self._directory is not None and files.plain(key):
                return await self._stream_to_file(key, chunks)
            return await self._stream_to_writer(key, chunks)
        except _SourceFailed as failed:
            # The chunks' own error (a client that went away) is no fault of the store's.
            raise failed.error from None

    @contextmanager
    def open_writer(self, key: str) -> Iterator[Any]:
        """A file-like writer (`write(buffer)`) for the object, from this thread: on S3 a
        multipart upload completed when the block ends, on a directory a temporary file renamed
        into place then; an exception in the block aborts it, leaving no object (and any earlier
        one under the key as it was)."""
        with (
            _translated(key),
            obstore.open_writer(self._store, key, buffer_size=PART_BYTES) as writer,
        ):
            yield writer

    async def _stream_to_writer(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        written = 0
        with _translated(key):
            async with obstore.open_writer_async(
                self._store, key, buffer_size=PART_BYTES
            ) as writer:
                async for chunk in _source(chunks):
                    await writer.write(chunk)
                    written += len(chunk)
        return written

    async def _stream_to_file(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        assert self._directory is not None
        try:
            source = (
                _ReadableSource(chunks) if isinstance(chunks, files.Readable) else _source(chunks)
            )
            return await files.write_stream(self._directory / key, source)
        except OSError as exc:  # the file system's: the chunks' come as _SourceFailed
            raise _unavailable(exc) from exc

    def delete(self, keys: Iterable[str]) -> None:
        """Delete these objects; a key with no object is no error (deleting is idempotent).
        S3 deletes a thousand per request and ignores missing keys; a directory store fails
        on the first missing one, so there each is deleted on its own."""
        keys = list(keys)
        if not keys:
            return
        with _translated(keys[0]):
            try:
                obstore.delete(self._store, keys)
            except (FileNotFoundError, NotFoundError):
                for key in keys:
                    with contextlib.suppress(FileNotFoundError, NotFoundError):
                        obstore.delete(self._store, key)

    async def delete_async(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if not keys:
            return
        with _translated(keys[0]):
            try:
                await obstore.delete_async(self._store, keys)
            except (FileNotFoundError, NotFoundError):
                for key in keys:
                    with contextlib.suppress(FileNotFoundError, NotFoundError):
                        await obstore.delete_async(self._store, key)

    # ─── Reads ──────────────────────────────────────────────────────────────────────────────────

    def get(self, key: str) -> memoryview:
        """The whole object, as a buffer that numpy wraps without a copy (a directory store's
        big ones: private memory maps of their files, tffleet/objectstore/files.py `read`)."""
        with _translated(key):
            if self._directory is not None and files.plain(key):
                return files.read(self._directory / key)
            return memoryview(obstore.get(self._store, key).bytes())

    async def get_async(self, key: str) -> memoryview:
        with _translated(key):
            result = await obstore.get_async(self._store, key)
            return memoryview(await result.bytes_async())

    def get_range(self, key: str, start: int, end: int) -> memoryview:
        """Bytes `start` to `end` (exclusive) of the object, one ranged read, as a read-only
        buffer numpy wraps without a copy: a part of a split job reads its own rows alone. A
        range past the object's end ends there (the reader finds it short)."""
        with _translated(key):
            if self._directory is not None and files.plain(key):
                return files.read(self._directory / key, start, end)
            return memoryview(obstore.get_range(self._store, key, start=start, end=end))

    async def get_range_async(self, key: str, start: int, end: int) -> memoryview:
        with _translated(key):
            return memoryview(await obstore.get_range_async(self._store, key, start=start, end=end))

    async def read_prefix_async(self, key: str, length: int) -> bytes:
        """At most the first `length` bytes (an .npy header, say): one ranged read."""
        size = await self.size_async(key)
        if size is None:
            raise ObjectMissing(key)
        with _translated(key):
            found = await obstore.get_range_async(self._store, key, start=0, end=min(length, size))
        return bytes(found)

    def get_ranges(self, key: str, starts: list[int], ends: list[int]) -> list[bytes]:
        """The bytes from each start to its end (past the object's end: to there), in as few
        requests as the ranges allow (near ones are read as one): an .npz's zip records and
        .npy headers, read without its data (api/npz_uploads.py)."""
        with _translated(key):
            found = obstore.get_ranges(self._store, key, starts=starts, ends=ends, coalesce=1 << 16)
        return [bytes(part) for part in found]

    async def stream_async(self, key: str, chunk_bytes: int = 1 << 20) -> AsyncIterator[bytes]:
        """The object in chunks, for an answer streamed to a client. ObjectMissing is raised
        by the first step of the iteration (before any byte is sent)."""
        with _translated(key):
            result = await obstore.get_async(self._store, key)
        with _translated(key):
            async for chunk in result.stream(min_chunk_size=chunk_bytes):
                yield bytes(chunk)

    def size(self, key: str) -> int | None:
        """The object's size in bytes, or None when there is none."""
        try:
            with _translated(key):
                return int(obstore.head(self._store, key)["size"])
        except ObjectMissing:
            return None

    async def size_async(self, key: str) -> int | None:
        try:
            with _translated(key):
                return int((await obstore.head_async(self._store, key))["size"])
        except ObjectMissing:
            return None

    def total_bytes(self, prefix: str | None = None) -> tuple[int, int]:
        """(objects, bytes) under `prefix` (all when None), by listing: a full walk, so callers
        that ask often keep their own figure (the database holds each object's size)."""
        objects = size = 0
        with _translated(prefix or ""):
            for batch in obstore.list(self._store, prefix=prefix):
                objects += len(batch)
                size += sum(int(meta["size"]) for meta in batch)
        return objects, size

    def keys(self, prefix: str) -> list[str]:
        """The keys of the objects under `prefix` (a job's, to delete them all), by listing;
        none under it is no error."""
        found: list[str] = []
        try:
            with _translated(prefix):
                for batch in obstore.list(self._store, prefix=prefix):
                    found += [str(meta["path"]) for meta in batch]
        except ObjectMissing:  # a directory store without that directory
            return []
        return found

    # ─── Presigned URLs ─────────────────────────────────────────────────────────────────────────

    def presign_put(self, key: str, expires_s: float) -> str:
        """A URL that lets whoever holds it PUT the object's bytes straight to the store until
        it expires, so they never pass through the API. S3 only (`presigns`)."""
        if not self.presigns:
            raise ValueError(f"{self.url}: a directory store hands out no presigned URLs")
        with _translated(key):
            return obstore.sign(self._store, "PUT", key, timedelta(seconds=expires_s))

    def presign_get(self, key: str, expires_s: float) -> str:
        if not self.presigns:
            raise ValueError(f"{self.url}: a directory store hands out no presigned URLs")
        with _translated(key):
            return obstore.sign(self._store, "GET", key, timedelta(seconds=expires_s))


def open_store(url: str, *, retry_s: float = RETRY_S) -> ObjectStore:
    """The store a TFFLEET_OBJECT_STORE URL names (see `parse_store_url`); a directory is made
    when missing. `retry_s`: how long a failed S3 call is tried again before StoreUnavailable."""
    where = parse_store_url(url)
    if where.directory is not None:
        directory = where.directory.resolve()
        directory.mkdir(parents=True, exist_ok=True)
        return ObjectStore(url, LocalStore(directory), presigns=False, directory=directory)
    assert where.bucket is not None
    return ObjectStore(url, _s3(where.bucket, where.prefix, retry_s), presigns=True)


def _s3(bucket: str, prefix: str | None, retry_s: float) -> S3Store:
    """An S3 store configured from the environment, as the AWS tools are; plain http is allowed
    when the endpoint says so (a SeaweedFS or MinIO beside the fleet)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config: Any = {}  # obstore's S3Config, a TypedDict of its stubs only
    if endpoint:
        config["endpoint"] = endpoint
        # A self-hosted service takes paths (endpoint/bucket/key), not bucket.endpoint hosts.
        config["virtual_hosted_style_request"] = False
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        config["region"] = "us-east-1"
    return S3Store(
        bucket,
        prefix=prefix,
        config=config,
        client_options={
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
            "connect_timeout": f"{CONNECT_TIMEOUT_S}s",
            "timeout": f"{REQUEST_TIMEOUT_S}s",
        },
        retry_config={"max_retries": 3, "retry_timeout": timedelta(seconds=retry_s)},
    )
