"""Named tensors at rest (a job's inputs and outputs in the database): one blob, a small JSON
header followed by the raw bytes, so the worker reads it back without copying.

A string tensor's entry holds each element's length, then the bytes one after another.

An entry may instead be a *reference*: its bytes are not in the blob but in an object of the
store (a whole .npy file), at `offset` in the object named by `key`. A large tensor goes that way
so that no big blob sits in SQL; the reader fetches the objects and hands them to `unpack`.
Only numeric and bool tensors go by reference (a string tensor's layout is ours, not .npy's).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tffleet.tensors.arrays import (
    DTYPES,
    STRING,
    TensorError,
    as_bytes,
    dtype_name,
    is_string,
    raw_bytes,
)

_MAGIC = b"TFT1"
_HEADER_LEN = struct.Struct("<I")
# A packed string tensor: each element's length in bytes, then the elements' bytes.
_STRING_LENGTH = np.dtype("<u8")

# An object's whole bytes, as ObjectStore.get gives them.
Buffer = bytes | bytearray | memoryview


class MissingObject(TensorError):
    """A reference's object was not among those given to `unpack` (the caller did not fetch it,
    or the store no longer has it)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object {key!r} of a referenced tensor is missing")
        self.key = key


@dataclass(frozen=True)
class Reference:
    """A tensor held in the store: `nbytes` bytes at `offset` (past the .npy header) in `key`."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def __post_init__(self) -> None:
        # Checked here so a wrong reference fails at pack, not later in a worker.
        if self.dtype not in DTYPES:
            raise TensorError(f"a reference cannot hold dtype {self.dtype!r}")
        expected = math.prod(self.shape) * DTYPES[self.dtype].itemsize
        if self.nbytes != expected or self.offset < 0:
            raise TensorError(
                f"reference to {self.key!r}: {self.nbytes} bytes at {self.offset} do not fit "
                f"{self.dtype} {list(self.shape)} ({expected} bytes)"
            )


def pack(
    tensors: Mapping[str, np.ndarray], references: Mapping[str, Reference] | None = None
) -> bytes:
    """Pack named arrays into one blob: magic, header length, JSON header, raw bytes.

    `references` name tensors held in the store: their entries come after the arrays' and hold
    no bytes in the blob."""
    header: list[dict[str, Any]] = []
    chunks = []
    offset = 0
    raw: bytes | memoryview
    for name, array in tensors.items():
        if is_string(array):
            dtype, raw = STRING, _pack_strings(name, array)
        elif dtype_name(array.dtype) in DTYPES:
            # Not np.ascontiguousarray: it turns a 0-d array into shape (1,). No copy where it
            # is C-order little-endian already (a view of a request's body, say): the one copy
            # is the join below.
            data = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
            dtype, raw = dtype_name(data.dtype), raw_bytes(data)
        else:
            raise TensorError(f"cannot pack {name!r}: dtype {array.dtype.name} is not supported")
        header.append(
            {
                "name": name,
                "dtype": dtype,
                "shape": list(array.shape),
                "offset": offset,
                "nbytes": len(raw),
            }
        )
        chunks.append(raw)
        offset += len(raw)
    for name, ref in (references or {}).items():
        if name in tensors:
            raise TensorError(f"cannot pack {name!r} both inline and by reference")
        header.append(
            {
                "name": name,
                "dtype": ref.dtype,
                "shape": list(ref.shape),
                "key": ref.key,
                "offset": ref.offset,
                "nbytes": ref.nbytes,
            }
        )
    head = orjson.dumps(header)
    return b"".join([_MAGIC, _HEADER_LEN.pack(len(head)), head, *chunks])


def _pack_strings(name: str, array: np.ndarray) -> bytes:
    try:
        items = as_bytes(array).ravel().tolist()
    except TensorError as exc:
        raise TensorError(f"cannot pack {name!r}: {exc}") from None
    lengths = np.fromiter(map(len, items), dtype=_STRING_LENGTH, count=len(items))
    return lengths.tobytes() + b"".join(items)


def _header(blob: Buffer) -> tuple[list[dict[str, Any]], int]:
    """The blob's entries, and where its bytes start."""
    if bytes(blob[:4]) != _MAGIC:
        raise TensorError("not a packed tensor blob")
    (head_len,) = _HEADER_LEN.unpack_from(blob, 4)
    start = 8 + head_len
    return orjson.loads(bytes(blob[8:start])), start


def _reference(item: dict[str, Any]) -> Reference:
    return Reference(
        key=item["key"],
        dtype=item["dtype"],
        shape=tuple(item["shape"]),
        offset=item["offset"],
        nbytes=item["nbytes"],
    )


def references(blob: Buffer) -> dict[str, Reference]:
    """The blob's entries that point into the store, by tensor name (what a reader must fetch
    before `unpack`)."""
    header, _ = _header(blob)
    return {item["name"]: _reference(item) for item in header if "key" in item}


def unpack(
    blob: Buffer, objects: Mapping[str, Buffer] | None = None, *, inline_only: bool = False
) -> dict[str, np.ndarray]:
    """The inverse of `pack`. The arrays are read-only: views of `blob` (or of a referenced
    object's bytes in `objects`, by key), or for strings object arrays of bytes.

    A reference whose key is not in `objects` raises `MissingObject`; with `inline_only`,
    references are left out (a reader that shows them as references: the API's job JSON)."""
    header, start = _header(blob)
    body = memoryview(blob)[start:]
    arrays = {}
    for item in header:
        if "key" in item:
            if not inline_only:
                arrays[item["name"]] = _unpack_reference(_reference(item), objects or {})
            continue
        raw = body[item["offset"] : item["offset"] + item["nbytes"]]
        if item["dtype"] == STRING:
            arrays[item["name"]] = _unpack_strings(raw, item["shape"])
        else:
            arrays[item["name"]] = np.frombuffer(raw, dtype=DTYPES[item["dtype"]]).reshape(
                item["shape"]
            )
    return arrays


def _unpack_reference(ref: Reference, objects: Mapping[str, Buffer]) -> np.ndarray:
    if ref.key not in objects:
        raise MissingObject(ref.key)
    data = memoryview(objects[ref.key])
    if ref.offset + ref.nbytes > data.nbytes:
        raise TensorError(f"object {ref.key!r} is shorter than its referenced tensor")
    array = np.frombuffer(
        data, dtype=DTYPES[ref.dtype], count=math.prod(ref.shape), offset=ref.offset
    )
    array.flags.writeable = False
    return array.reshape(ref.shape)


def _unpack_strings(raw: memoryview, shape: list[int]) -> np.ndarray:
    count = math.prod(shape)
    split = count * _STRING_LENGTH.itemsize
    ends = np.cumsum(np.frombuffer(raw[:split], dtype=_STRING_LENGTH)).tolist()
    starts = [0, *ends][:-1]
    data = raw[split:]
    array = np.empty(count, dtype=object)
    array[:] = [bytes(data[start:end]) for start, end in zip(starts, ends, strict=True)]
    array.flags.writeable = False
    return array.reshape(shape)
