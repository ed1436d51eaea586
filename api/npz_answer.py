"""A succeeded job's outputs as one .npz answer where some of them are held in the object store
(too big to inline, DESIGN §13): the inline ones written as .npy members, each stored one read
from the store and copied into the zip as it comes, so the answer is one request, not one plus
one per stored output (`GET /v1/jobs/{id}/outputs/{name}`).

A stored output's object is a whole .npy already (header, then the tensor's bytes), so it is a
member as it is. The zip is streamed: zipfile writes into a sink that hands each piece on, its
members' CRC-32 and sizes in a data descriptor after their data (what zipfile writes where it
cannot seek back; np.load and `tensors.read_npz` read it), so the API holds one chunk of each
object at a time, never the outputs whole. An answer whose objects take at most `_WHOLE_BYTES`
is gathered into one body instead: one send, and a Content-Length.

As `GET .../outputs/{name}` (api/downloads.py), each object's first chunk is read before the
answer starts: an object gone from the store is a 410 `outputs_gone`, a store that does not
answer a 503, never a broken 200. A store that fails later cuts the answer short: the client
sees a broken transfer, never a short .npz.
"""

from __future__ import annotations

import asyncio
import contextlib
import zipfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import numpy as np

from tffleet import tensors
from tffleet.errors import OutputsGone
from tffleet.objectstore import ObjectMissing, ObjectStore

# Objects up to this much together are gathered into one body: a small answer in one send.
_WHOLE_BYTES = 1 << 20


def stored_bytes(references: Mapping[str, tensors.Reference]) -> int:
    """What the answer would read from the store: the referenced objects' sizes (a whole .npy
    each: its header, `offset` bytes, then the tensor's)."""
    return sum(ref.offset + ref.nbytes for ref in references.values())


@dataclass
class _Opened:
    """A stored output's object being read: its first chunk, and the rest to come."""

    name: str
    size: int
    first: bytes
    rest: AsyncIterator[bytes]


async def npz_body(
    store: ObjectStore, job_id: str, blob: bytes
) -> tuple[AsyncIterator[bytes], int | None]:
    """The job's outputs (its packed `blob`) as an .npz, in pieces, and its length where it was
    gathered whole (None: streamed). OutputsGone (410) for an object no longer in the store,
    StoreUnavailable (503) for a store that does not answer; TensorError for string outputs,
    which no .npy holds without pickle (before anything is read from the store)."""
    inline = tensors.unpack(blob, inline_only=True)
    for name, array in inline.items():
        if tensors.is_string(array):
            raise tensors.TensorError(f"output {name!r} holds strings")
    references = tensors.references(blob)
    opened = await _open_all(store, job_id, references)
    pieces = _zipped(inline, opened)
    if stored_bytes(references) > _WHOLE_BYTES:
        return pieces, None
    body = b"".join([piece async for piece in pieces])
    return _one(body), len(body)


async def _one(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _open_all(
    store: ObjectStore, job_id: str, references: Mapping[str, tensors.Reference]
) -> list[_Opened]:
    """Each object's stream with its first chunk read, all at once; where one fails, those
    opened are closed and its error raised (the first in the job's order)."""
    found = await asyncio.gather(
        *(_open(store, job_id, name, ref) for name, ref in references.items()),
        return_exceptions=True,
    )
    opened = [item for item in found if isinstance(item, _Opened)]
    for item in found:
        if isinstance(item, BaseException):
            await _close(opened)
            raise item
    return opened


async def _open(store: ObjectStore, job_id: str, name: str, ref: tensors.Reference) -> _Opened:
    chunks = store.stream_async(ref.key)
    try:
        first = await anext(chunks)
    except ObjectMissing:
        raise OutputsGone(
            f"name: output {name!r} of job {job_id} is no longer in the object store"
        ) from None
    except StopAsyncIteration:
        first = b""
    return _Opened(name, ref.offset + ref.nbytes, first, chunks)


async def _close(opened: list[_Opened]) -> None:
    for item in opened:
        with contextlib.suppress(Exception):
            await item.rest.aclose()  # type: ignore[attr-defined]  # an async generator's


class _Sink:
    """What zipfile writes into: it keeps the pieces for the answer to send, counts where it is
    (`tell`), and cannot seek, so zipfile writes each member's CRC and sizes after its data."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.at = 0

    def write(self, data: bytes, /) -> int:
        self.pieces.append(data)  # bytes all: headers, .npy files, the store's chunks
        self.at += len(data)
        return len(data)

    def tell(self) -> int:
        return self.at

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> list[bytes]:
        pieces, self.pieces = self.pieces, []
        return pieces


def _member(name: str, size: int) -> zipfile.ZipInfo:
    # Dated 1980-01-01, as tensors.write_npz writes them; its size, known in advance, has
    # zipfile write zip64 sizes where they need them.
    member = zipfile.ZipInfo(f"{name}.npy")
    member.file_size = size
    return member


async def _zipped(inline: Mapping[str, np.ndarray], opened: list[_Opened]) -> AsyncIterator[bytes]:
    sink = _Sink()
    try:
        with zipfile.ZipFile(sink, "w") as archive:  # stored, not compressed
            for name, array in inline.items():
                data = tensors.write_npy(array)
                with archive.open(_member(name, len(data)), "w") as out:
                    out.write(data)
            for item in opened:
                with archive.open(_member(item.name, item.size), "w") as out:
                    out.write(item.first)
                    for piece in sink.take():
                        yield piece
                    async for chunk in item.rest:
                        out.write(chunk)
                        for piece in sink.take():
                            yield piece
        for piece in sink.take():  # the last descriptor and the central directory
            yield piece
    finally:
        await _close(opened)
