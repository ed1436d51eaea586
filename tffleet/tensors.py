"""Tensors on the wire and at rest, with NumPy only (no TensorFlow).

On the wire (the HTTP contract) a tensor is either nested JSON lists, batch dimension first, or
a binary envelope `{"b64": ..., "dtype": "float32", "shape": [n, ...]}` of C-order little-endian
bytes. At rest (the job row) a set of named tensors is packed into one blob: a small JSON header
followed by the raw bytes, so the worker reads it back without copying.
"""

from __future__ import annotations

import binascii
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
import pybase64  # SIMD base64: decoding a 12 MB tensor takes 2 ms, not 50

# The dtypes a signature may name, by their NumPy/TensorFlow name.
DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    )
}

_MAGIC = b"TFT1"
_HEADER_LEN = struct.Struct("<I")


class TensorError(ValueError):
    """A tensor that cannot be decoded; the message says why, without naming the input."""


def decode(value: Any, *, dtype: str) -> np.ndarray:
    """Decode a wire tensor to an array of the signature's `dtype`."""
    if isinstance(value, Mapping):
        return _decode_envelope(value, dtype=dtype)
    if not isinstance(value, list):
        raise TensorError("expected nested lists or a {b64, dtype, shape} object")
    return _decode_lists(value, dtype=dtype)


def _decode_envelope(value: Mapping[str, Any], *, dtype: str) -> np.ndarray:
    unknown = set(value) - {"b64", "dtype", "shape"}
    if unknown or not {"b64", "dtype", "shape"} <= set(value):
        raise TensorError("a binary tensor needs exactly the keys b64, dtype and shape")
    sent = value["dtype"]
    if sent != dtype:
        raise TensorError(f"expected dtype {dtype}, got {sent!r}")
    shape = value["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise TensorError("shape must be a list of non-negative integers")
    if not isinstance(value["b64"], str):
        raise TensorError("b64 must be a base64 string")
    try:
        raw = pybase64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TensorError(f"b64 is not valid base64 ({exc})") from None
    np_dtype = DTYPES[dtype]
    # Python integers: np.prod in int64 wraps around, and a wrapped product of a huge shape could
    # match the byte count.
    expected = math.prod(shape) * np_dtype.itemsize
    if len(raw) != expected:
        raise TensorError(
            f"b64 holds {len(raw)} bytes but dtype {dtype} and shape {shape} need {expected}"
        )
    try:
        array = np.frombuffer(raw, dtype=np_dtype).reshape(shape)
    except ValueError as exc:  # e.g. [0, 2**70]: no bytes, but NumPy cannot hold the shape
        raise TensorError(f"shape {shape} is not supported ({exc})") from None
    if np_dtype.kind == "b" and raw.translate(None, b"\x00\x01"):
        raise TensorError("a bool tensor's bytes must each be 0 or 1")
    return array


def _decode_lists(value: list[Any], *, dtype: str) -> np.ndarray:
    np_dtype = DTYPES[dtype]
    try:
        natural = np.asarray(value)
    except ValueError:
        raise TensorError("nested lists are ragged (rows of different lengths)") from None
    except OverflowError:
        raise TensorError(f"integer out of range for dtype {dtype}") from None
    kind = natural.dtype.kind
    if natural.size == 0:
        return natural.astype(np_dtype)
    if np_dtype.kind in "iu" and kind in "Of" and _all_python_ints(value):
        # NumPy reads integers beyond 64 bits as objects, and a mix of negative and beyond-int64
        # ones as float64 (losing digits): check them as the Python integers they are.
        info = np.iinfo(np_dtype)
        flat = _flatten(value)
        if min(flat) < info.min or max(flat) > info.max:
            raise TensorError(f"integer out of range for dtype {dtype}")
        return np.array(value, dtype=np_dtype)
    if kind == "O" or kind in "USV":
        raise TensorError(f"expected numbers of dtype {dtype}")
    if np_dtype.kind == "f":
        # true/false are not numbers here, as they are not in TensorFlow.
        if kind not in "iuf":
            raise TensorError(f"expected numbers of dtype {dtype}")
        with np.errstate(over="ignore"):
            array = natural.astype(np_dtype, copy=False)
        if not np.isfinite(array).all() and np.isfinite(natural).all():
            raise TensorError(f"number out of range for dtype {dtype}")
        return array
    if np_dtype.kind in "iu":
        if kind not in "iu":
            raise TensorError(f"expected integers for dtype {dtype}")
        info = np.iinfo(np_dtype)
        if natural.min() < info.min or natural.max() > info.max:
            raise TensorError(f"integer out of range for dtype {dtype}")
    elif np_dtype.kind == "b" and kind != "b":
        raise TensorError("expected true/false for dtype bool")
    return natural.astype(np_dtype, copy=False)


def _flatten(value: Any) -> list[int]:
    if isinstance(value, list):
        return [item for row in value for item in _flatten(row)]
    return [value]


def _all_python_ints(value: Any) -> bool:
    if isinstance(value, list):
        return all(_all_python_ints(item) for item in value)
    return isinstance(value, int) and not isinstance(value, bool)


def encode(array: np.ndarray, *, encoding: str = "json") -> Any:
    """Encode an array for the wire, as nested lists or as a binary envelope."""
    if encoding == "b64":
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        return {
            "b64": pybase64.b64encode(np.ascontiguousarray(little).tobytes()).decode("ascii"),
            "dtype": array.dtype.name,
            "shape": list(array.shape),
        }
    return array.tolist()


def pack(tensors: Mapping[str, np.ndarray]) -> bytes:
    """Pack named arrays into one blob: magic, header length, JSON header, raw bytes."""
    header = []
    chunks = []
    offset = 0
    for name, array in tensors.items():
        if array.dtype.name not in DTYPES:
            # Anything else (strings, objects) has no portable raw bytes; an object array's
            # bytes are pointers.
            raise TensorError(f"cannot pack {name!r}: dtype {array.dtype.name} is not supported")
        # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).
        data = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
        raw = data.tobytes()
        header.append(
            {
                "name": name,
                "dtype": data.dtype.name,
                "shape": list(data.shape),
                "offset": offset,
                "nbytes": len(raw),
            }
        )
        chunks.append(raw)
        offset += len(raw)
    head = orjson.dumps(header)
    return b"".join([_MAGIC, _HEADER_LEN.pack(len(head)), head, *chunks])


def unpack(blob: bytes) -> dict[str, np.ndarray]:
    """The inverse of `pack`; the arrays are read-only views of `blob`."""
    if blob[:4] != _MAGIC:
        raise TensorError("not a packed tensor blob")
    (head_len,) = _HEADER_LEN.unpack_from(blob, 4)
    start = 8 + head_len
    header = orjson.loads(blob[8:start])
    body = memoryview(blob)[start:]
    return {
        item["name"]: np.frombuffer(
            body[item["offset"] : item["offset"] + item["nbytes"]], dtype=DTYPES[item["dtype"]]
        ).reshape(item["shape"])
        for item in header
    }


def batch_size(tensors: Mapping[str, np.ndarray]) -> int:
    """Samples in a set of named tensors (all share the leading dimension)."""
    return int(next(iter(tensors.values())).shape[0]) if tensors else 0
