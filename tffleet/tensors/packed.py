"""Named tensors at rest (a job's inputs and outputs in the database): one blob, a small JSON
header followed by the raw bytes, so the worker reads it back without copying.

A string tensor's entry holds each element's length, then the bytes one after another.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping

import numpy as np
import orjson

from tffleet.tensors.arrays import DTYPES, STRING, TensorError, as_bytes, is_string, raw_bytes

_MAGIC = b"TFT1"
_HEADER_LEN = struct.Struct("<I")
# A packed string tensor: each element's length in bytes, then the elements' bytes.
_STRING_LENGTH = np.dtype("<u8")


def pack(tensors: Mapping[str, np.ndarray]) -> bytes:
    """Pack named arrays into one blob: magic, header length, JSON header, raw bytes."""
    header = []
    chunks = []
    offset = 0
    raw: bytes | memoryview
    for name, array in tensors.items():
        if is_string(array):
            dtype, raw = STRING, _pack_strings(name, array)
        elif array.dtype.name in DTYPES:
            # Not np.ascontiguousarray: it turns a 0-d array into shape (1,). No copy where it
            # is C-order little-endian already (a view of a request's body, say): the one copy
            # is the join below.
            data = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
            dtype, raw = data.dtype.name, raw_bytes(data)
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
    head = orjson.dumps(header)
    return b"".join([_MAGIC, _HEADER_LEN.pack(len(head)), head, *chunks])


def _pack_strings(name: str, array: np.ndarray) -> bytes:
    try:
        items = as_bytes(array).ravel().tolist()
    except TensorError as exc:
        raise TensorError(f"cannot pack {name!r}: {exc}") from None
    lengths = np.fromiter(map(len, items), dtype=_STRING_LENGTH, count=len(items))
    return lengths.tobytes() + b"".join(items)


def unpack(blob: bytes) -> dict[str, np.ndarray]:
    """The inverse of `pack`. The arrays are read-only: views of `blob`, or for strings object
    arrays of bytes."""
    if blob[:4] != _MAGIC:
        raise TensorError("not a packed tensor blob")
    (head_len,) = _HEADER_LEN.unpack_from(blob, 4)
    start = 8 + head_len
    header = orjson.loads(blob[8:start])
    body = memoryview(blob)[start:]
    arrays = {}
    for item in header:
        raw = body[item["offset"] : item["offset"] + item["nbytes"]]
        if item["dtype"] == STRING:
            arrays[item["name"]] = _unpack_strings(raw, item["shape"])
        else:
            arrays[item["name"]] = np.frombuffer(raw, dtype=DTYPES[item["dtype"]]).reshape(
                item["shape"]
            )
    return arrays


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
