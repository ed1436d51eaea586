"""Reading a JSON request body: 415 if it is not JSON, 413 if too large, 400 if malformed.

A large body is parsed in a worker thread, and a body of more JSON items than `max_items` (by
its commas, counted before parsing) is refused: parsing holds the interpreter for its whole
length, about 0.3 s per million numbers here, while every other request of the process waits.
Large tensors travel as binary envelopes, which parse in a few milliseconds per megabyte.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import orjson
from fastapi import Request

from api.httpserver import READER, BodyReader
from tffleet import tensors
from tffleet.errors import (
    HTTPStatusError,
    InvalidInput,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
)

_T = TypeVar("_T")


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


# Bodies up to this size are parsed and checked on the event loop: a thread hop would cost more.
INLINE_BYTES = 64 * 1024


async def read_json(
    request: Request, *, max_bytes: int, max_items: int, any_type: bool = False
) -> Any:
    """The parsed body. `any_type`: whatever its Content-Type says (TF Serving's clients, `curl
    -d` among them, send none or a form's)."""
    if not any_type and not _is_json(request.headers.get("content-type", "")):
        raise UnsupportedMediaType("Content-Type must be application/json")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    # Gathered and counted chunk by chunk as it arrives, so no step holds the loop for long.
    # Each item of a JSON list or object but the first follows a comma: the count is an upper
    # bound (commas inside strings count too; a base64 envelope has none).
    data, items = bytearray(), 0
    async for chunk in request.stream():
        data += chunk
        items += chunk.count(b",")
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
        if items > max_items:
            raise PayloadTooLarge(
                f"body holds over {max_items} JSON items (TFFLEET_MAX_JSON_ITEMS); send large "
                'tensors as binary envelopes {"b64", "dtype", "shape"} (the Python client does)'
            )
    if len(data) <= INLINE_BYTES:
        return _loads(data)
    return await asyncio.to_thread(_loads, data)


def _loads(data: bytes | bytearray) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None


async def read_bytes(request: Request, *, max_bytes: int) -> bytes:
    """The whole body, 413 past `max_bytes`: the chunks as they arrive, joined once."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
        if chunk:
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# ─── An .npy streamed on (into the object store), never held whole ──────────────────────────────

# The most an .npy header may take (np.load's own limit, with its magic and length).
_NPY_MAX_HEADER = 12 + 10_000


async def npy_stream(
    request: Request, *, max_bytes: int, invalid: type[HTTPStatusError] = InvalidInput
) -> tuple[tensors.NpyHeader, NpyBody]:
    """An `application/x-npy` body whose header is read from its first bytes and checked, and
    the whole body (header included) to stream on (`NpyBody`). It raises `invalid` (422 by
    default) naming `body` where the body holds more or fewer bytes than its header says: a
    writer fed it keeps nothing. 413 past `max_bytes`, from the header's size before a byte
    is streamed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    chunks = aiter(request.stream())
    head = bytearray()
    need = 12
    while len(head) < need:
        chunk = await anext(chunks, None)
        if chunk is None:
            break
        head += chunk
        if len(head) >= 12 and need == 12:
            need = max(need, _npy(tensors.npy_header_size, bytes(head[:12]), invalid))
            if need > _NPY_MAX_HEADER:
                raise invalid(f"body: an .npy header of {need} bytes is over 10000")
    if not head:
        raise invalid("body: empty; expected an .npy file (what np.save writes)")
    header = _npy(tensors.read_npy_header, bytes(head[:need]), invalid)
    total = header.offset + header.nbytes
    if total > max_bytes:
        raise PayloadTooLarge(
            f"body: dtype {header.dtype.name} and shape {list(header.shape)} make {total} bytes, "
            f"over the limit of {max_bytes} bytes"
        )
    if declared is not None and declared.isdigit() and int(declared) != total:
        raise invalid(_size_mismatch(header, int(declared) - header.offset))
    reader = request.scope.get("extensions", {}).get(READER)
    return header, NpyBody(bytes(head), chunks, header, total, invalid, reader)


class NpyBody:
    """An .npy body, its first bytes (the header's) read already: iterated, the chunks as they
    arrive, each counted against the header's size; or, where the server offers it
    (api/httpserver.py `BodyReader`), read into the writer's own buffer (`readinto`, as
    tffleet/objectstore/files.py `Readable` asks), the kernel copying from the socket into it."""

    def __init__(
        self,
        head: bytes,
        rest: AsyncIterator[bytes],
        header: tensors.NpyHeader,
        total: int,
        invalid: type[HTTPStatusError],
        reader: BodyReader | None,
    ) -> None:
        self.size = total
        self._head, self._rest, self._header, self._invalid = head, rest, header, invalid
        self._reader = reader
        self._taken = 0  # bytes handed out by readinto
        self._started = False

    def readable(self) -> bool:
        """Whether `readinto` may be used: not iterated yet, and the server reads into buffers."""
        return (
            not self._started
            and len(self._head) <= self.size
            and self._reader is not None
            and self._reader.usable()
        )

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._started = True
        return _counted(self._head, self._rest, self._header, self.size, self._invalid)

    async def readinto(self, buffer: memoryview) -> int:
        """Fill `buffer` with the body's next bytes, its first ones first; how many (0: its end,
        `invalid` where that came short of the header's size)."""
        assert self._reader is not None
        if self._taken == self.size or not buffer:
            return 0
        if self._taken < len(self._head):
            got = min(len(buffer), len(self._head) - self._taken)
            buffer[:got] = self._head[self._taken : self._taken + got]
        else:
            got = await self._reader.readinto(buffer[: self.size - self._taken])
        self._taken += got
        if not got and self._taken != self.size:
            raise self._invalid(_size_mismatch(self._header, self._taken - self._header.offset))
        return got


def _npy(read: Callable[[bytes], _T], data: bytes, invalid: type[HTTPStatusError]) -> _T:
    try:
        return read(data)
    except tensors.TensorError as exc:
        raise invalid(f"body: {exc}") from None


def by_reference_problem(header: tensors.NpyHeader) -> str | None:
    """Why an .npy cannot be stored as the object a job references (a worker reads it as it
    lies: a number or bool dtype, little-endian, C order), or None."""
    dtype = header.dtype
    if dtype.name not in tensors.DTYPES:
        return (
            f"dtype {dtype.name} cannot go by reference (numbers and bool only); send strings "
            "inline"
        )
    if dtype.byteorder == ">":
        return "a big-endian array; save it little-endian (.astype('<...'))"
    if header.fortran_order and len(header.shape) > 1:
        return "a Fortran-order array; save np.ascontiguousarray(array)"
    return None


def _size_mismatch(header: tensors.NpyHeader, held: int) -> str:
    return (
        f"body: holds {held} bytes of data but dtype {header.dtype.name} and shape "
        f"{list(header.shape)} need {header.nbytes}"
    )


async def _counted(
    head: bytes,
    rest: AsyncIterator[bytes],
    header: tensors.NpyHeader,
    total: int,
    invalid: type[HTTPStatusError],
) -> AsyncIterator[bytes]:
    size = len(head)
    if size > total:
        raise invalid(_size_mismatch(header, size - header.offset))
    yield head
    async for chunk in rest:
        size += len(chunk)
        if size > total:
            raise invalid(_size_mismatch(header, size - header.offset))
        if chunk:
            yield chunk
    if size != total:
        raise invalid(_size_mismatch(header, size - header.offset))
