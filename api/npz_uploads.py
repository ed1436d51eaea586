"""An .npz upload (DESIGN §13): named arrays stored as one object, each member referenced where it
lies in it, so a job that names one reads no copy of it.

The body (what `np.savez` writes: a zip whose members are stored, not compressed) is streamed into
the store whole, as an .npy upload is, and only then indexed, without reading its data: the zip's
central directory, at its end, says where each member's local header is (zipfile reads it through
`_Ranged`, a file whose reads are ranged reads of the object), and the local header where the
member's .npy starts; that .npy's header gives its dtype and shape. Those ranges are a few hundred
bytes a member, fetched together (`ObjectStore.get_ranges`). What the upload's row records is each
member's dtype, shape, and the offset and length of its data in the object: a job's packed
`Reference` points there, and the worker slices the object it fetched as it does an .npy's.

A job names a member as `tffleet://uploads/<id>/<member>`, or as `tffleet://uploads/<id>` for
an input of the member's own name (`reference`).
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from api.body import by_reference_problem
from db.models import Upload
from tffleet import tensors
from tffleet.errors import InvalidInput, PayloadTooLarge
from tffleet.objectstore import ObjectStore, keys

# What np.savez writes first: a member's local header, its compression method at byte 8.
_LOCAL = struct.Struct("<4s22xHH")
_LOCAL_MAGIC = b"PK\x03\x04"
_ENCRYPTED = 0x1
# The most one read through `_Ranged` takes: the central directory of MAX_NPZ_MEMBERS members
# (128 bytes each, as tensors.read_npz bounds it), or the zip's end record and its comment.
_MAX_READ = tensors.MAX_NPZ_MEMBERS * 128
# Read with each local header, in the same range: its extra field (np.savez writes a zip64 one of
# 20 bytes) and the member's .npy header (128 bytes for most arrays). A longer one costs a read.
_HEAD_GUESS = 64 + 512


@dataclass(frozen=True)
class Member:
    """One array of an .npz object: its dtype and shape, and where its data lies in the object."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def as_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "offset": self.offset,
                "nbytes": self.nbytes}  # fmt: skip


async def npz_stream(request: Request, *, max_bytes: int) -> AsyncIterator[bytes]:
    """An `application/x-npz` body as chunks to stream into the store, its first bytes checked
    before any is stored (a zip, its first member not compressed): 422 naming `body`, and 413
    past `max_bytes` (from Content-Length at once, else where the chunks pass it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    chunks = aiter(request.stream())
    head = b""
    while len(head) < _LOCAL.size:
        chunk = await anext(chunks, None)
        if chunk is None:
            break
        head += chunk
    if len(head) < _LOCAL.size or head[:4] != _LOCAL_MAGIC:
        raise InvalidInput(
            "body: not an .npz archive (no zip header at its start); send what np.savez writes"
        )
    if int.from_bytes(head[8:10], "little") != zipfile.ZIP_STORED:
        raise InvalidInput(
            "body: its members are compressed; send what np.savez writes, not np.savez_compressed"
        )
    return _bounded(head, chunks, max_bytes)


async def _bounded(head: bytes, rest: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[bytes]:
    size = len(head)
    if size > max_bytes:
        raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
    yield head
    async for chunk in rest:
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
        if chunk:
            yield chunk


def index(store: ObjectStore, key: str, size: int) -> dict[str, Member]:
    """The members of the .npz object under `key` (`size` bytes), by name, each checked as an
    .npy upload is (a number or bool dtype, little-endian, C order, exactly its bytes).
    InvalidInput naming `body` for a malformed zip, a compressed, encrypted or misnamed member,
    or an array that cannot go by reference. Blocking: the API runs it in a thread."""
    try:
        with zipfile.ZipFile(_Ranged(store, key, size)) as archive:
            infos = archive.infolist()
    except tensors.TensorError as exc:
        raise InvalidInput(f"body: {exc}") from None
    except (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError) as exc:
        raise InvalidInput(f"body: not an .npz archive ({exc})") from None
    if not infos:
        raise InvalidInput("body: an .npz of no arrays")
    if len(infos) > tensors.MAX_NPZ_MEMBERS:
        raise InvalidInput(f"body: {len(infos)} members; an .npz holds at most "
                           f"{tensors.MAX_NPZ_MEMBERS}")  # fmt: skip
    names = [_name(info) for info in infos]
    if len(set(names)) < len(names):
        raise InvalidInput(f"body: a member named twice among {sorted(names)[:20]}")
    starts = [info.header_offset for info in infos]
    ends = [min(size, at + _LOCAL.size + 2 * len(info.orig_filename) + _HEAD_GUESS)
            for at, info in zip(starts, infos, strict=True)]  # fmt: skip
    heads = store.get_ranges(key, starts, ends)
    return {
        name: _member(store, key, size, info, head)
        for name, info, head in zip(names, infos, heads, strict=True)
    }


def _name(info: zipfile.ZipInfo) -> str:
    where = f"body: member {info.filename!r}"
    if not info.filename.endswith(".npy") or info.filename == ".npy":
        raise InvalidInput(f"{where} is not an .npy array (np.savez names them NAME.npy)")
    if info.flag_bits & _ENCRYPTED:
        raise InvalidInput(f"{where} is encrypted")
    if info.compress_type != zipfile.ZIP_STORED:
        raise InvalidInput(
            f"{where} is compressed; send what np.savez writes, not np.savez_compressed"
        )
    return info.filename[: -len(".npy")]


def _member(store: ObjectStore, key: str, size: int, info: zipfile.ZipInfo, head: bytes) -> Member:
    """Where a member's .npy lies (after its local header) and what its header says; `head`:
    the bytes from its local header on, read already (more are read if they fall short)."""
    where = f"body: member {info.filename!r}"
    at = info.header_offset
    if len(head) < _LOCAL.size or head[:4] != _LOCAL_MAGIC:
        raise InvalidInput(f"{where}: no zip header where the directory says it starts")
    _, name_len, extra_len = _LOCAL.unpack_from(head)
    start = at + _LOCAL.size + name_len + extra_len  # the .npy's first byte
    if start + info.compress_size > size:
        raise InvalidInput(f"{where}: its data runs past the end of the body")
    skip = start - at
    try:
        npy = head[skip:]
        need = tensors.npy_header_size(npy if len(npy) >= 12 else _read(store, key, start, 12))
        if len(npy) < need:
            npy = _read(store, key, start, need)
        header = tensors.read_npy_header(npy[:need])
    except tensors.TensorError as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    problem = by_reference_problem(header)
    held = info.compress_size - header.offset
    if problem is None and held != header.nbytes:
        problem = (f"holds {held} bytes of data but dtype {header.dtype.name} and shape "
                   f"{list(header.shape)} need {header.nbytes}")  # fmt: skip
    if problem is not None:
        raise InvalidInput(f"{where}: {problem}")
    return Member(header.dtype.name, header.shape, start + header.offset, header.nbytes)


def _read(store: ObjectStore, key: str, start: int, length: int) -> bytes:
    if length > 12 + 10_000:
        raise tensors.TensorError(f"an .npy header of {length} bytes is over 10000")
    return store.get_ranges(key, [start], [start + length])[0]


class _Ranged:
    """The object as the seekable file zipfile reads a directory from: each read one ranged
    read, none longer than `_MAX_READ` (a zip claiming a longer directory is refused, as
    tensors.read_npz refuses it)."""

    def __init__(self, store: ObjectStore, key: str, size: int) -> None:
        self.store, self.key, self.size, self.at = store, key, size, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.at, self.size)[whence]
        if base + offset < 0:
            raise ValueError("seek before the start of the .npz")
        self.at = base + offset
        return self.at

    def read(self, n: int | None = -1, /) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.at + n)
        if end <= self.at:
            return b""
        if end - self.at > _MAX_READ:
            raise tensors.TensorError(
                f"a zip directory of {end - self.at} bytes; an .npz holds at most "
                f"{tensors.MAX_NPZ_MEMBERS} members, in at most {_MAX_READ} bytes of directory"
            )
        data = self.store.get_ranges(self.key, [self.at], [end])[0]
        self.at += len(data)
        return data


# ─── Named by a job ──────────────────────────────────────────────────────────────────────────────


def parse_uri(where: str, value: dict[str, Any]) -> tuple[str, str | None]:
    """The upload a `{"uri"}` names, and the member it names in an .npz (None: none named), or
    InvalidInput naming the input (`where`)."""
    uri = value.get("uri")
    if set(value) != {"uri"} or not isinstance(uri, str):
        raise InvalidInput(f'{where}: a reference is {{"uri": "tffleet://uploads/<id>"}} alone')
    base, slash, member = _split(uri)
    upload_id = keys.parse_upload_uri(base)
    if upload_id is None or (slash and not member):
        scheme = uri.partition("://")[0] if "://" in uri else ""
        if scheme and scheme != "tffleet":
            raise InvalidInput(
                f"{where}: {scheme}:// URIs are not fetched; upload the tensor "
                "(POST /v1/uploads) and give its tffleet://uploads/<id>"
            )
        raise InvalidInput(
            f"{where}: {uri[:100]!r} is no upload URI (tffleet://uploads/ and 32 hex digits, "
            "and /<member> for an array of an .npz)"
        )
    return upload_id, member if slash else None


def _split(uri: str) -> tuple[str, str, str]:
    """`tffleet://uploads/<id>/<member>` as (its upload's URI, "/", the member); any other URI
    as (it, "", "")."""
    cut = len(keys.UPLOAD_URI_PREFIX) + 32
    if uri.startswith(keys.UPLOAD_URI_PREFIX) and uri[cut : cut + 1] == "/":
        return uri[:cut], "/", uri[cut + 1 :]
    return uri, "", ""


def reference(upload: Upload, where: str, name: str, member: str | None) -> tensors.Reference:
    """The reference input `name` makes to an .npz upload's member (`member`, or the one named
    as the input); InvalidInput naming the input when it has none such."""
    uri = keys.upload_uri(upload.id)
    if upload.members is None:
        raise InvalidInput(f"{where}: {uri} is one array (an .npy), not an .npz: name it {uri}")
    wanted = name if member is None else member
    found = upload.members.get(wanted)
    if found is None:
        held = ", ".join(sorted(upload.members)[:20])
        raise InvalidInput(
            f"{where}: {uri} holds no member {wanted!r} (it holds {held}); name one as "
            f"{uri}/<member>"
        )
    return tensors.Reference(
        key=upload.key,
        dtype=found["dtype"],
        shape=tuple(found["shape"]),
        offset=found["offset"],
        nbytes=found["nbytes"],
    )
