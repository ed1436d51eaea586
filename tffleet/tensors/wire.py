"""A tensor in a JSON body: nested lists, batch dimension first, or a binary envelope
`{"b64": ..., "dtype": "float32", "shape": [n, ...]}` of C-order little-endian bytes (the HTTP
contract's two forms).

A string tensor is nested lists of JSON strings (UTF-8), where an element may be `{"b64": ...}`
for bytes that are not text (TF Serving's convention); it has no binary envelope.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pybase64  # SIMD base64: decoding a 12 MB tensor takes 2 ms, not 50

from tffleet.tensors.arrays import (
    DTYPES,
    STRING,
    TensorError,
    dtype_name,
    is_string,
    not_a_string,
)

# Nesting deeper than this is no tensor (NumPy's own limit is 64 dimensions).
_MAX_RANK = 32


def decode(value: Any, *, dtype: str) -> np.ndarray:
    """Decode a wire tensor to an array of the signature's `dtype`."""
    if dtype == STRING:
        if not isinstance(value, list):
            raise TensorError(
                'expected nested lists of strings (an element may be {"b64": ...} for bytes)'
            )
        return _decode_strings(value)
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
    if np_dtype.kind == "b":
        if kind != "b":
            raise TensorError("expected true/false for dtype bool")
        return natural.astype(np_dtype, copy=False)
    wanted = f"integers for dtype {dtype}" if np_dtype.kind in "iu" else f"numbers of dtype {dtype}"
    if kind in "US":
        raise TensorError(f"expected {wanted}, got strings")
    # true/false are not numbers here, as they are not in TensorFlow; NumPy reads [true, 2] as
    # the integers [1, 2].
    if kind == "b" or (kind in "iuf" and _holds_bool(value)):
        raise TensorError(f"expected {wanted}, got true/false")
    if kind not in "iuf":
        raise TensorError(f"expected {wanted}")
    if np_dtype.kind == "f":
        with np.errstate(over="ignore"):
            array = natural.astype(np_dtype, copy=False)
        if not np.isfinite(array).all() and np.isfinite(natural).all():
            raise TensorError(f"number out of range for dtype {dtype}")
        return array
    if kind not in "iu":
        raise TensorError(f"expected {wanted}")
    info = np.iinfo(np_dtype)
    if natural.min() < info.min or natural.max() > info.max:
        raise TensorError(f"integer out of range for dtype {dtype}")
    return natural.astype(np_dtype, copy=False)


def _holds_bool(value: list[Any]) -> bool:
    """Whether rectangular nested lists hold a true/false; the innermost rows are checked in C."""
    if value and isinstance(value[0], list):
        return any(_holds_bool(row) for row in value)
    return bool in map(type, value)


def _decode_strings(value: list[Any]) -> np.ndarray:
    """Nested lists of strings (or {"b64": ...}) to an object array of bytes."""
    shape: list[int] = []
    probe: Any = value
    while isinstance(probe, list):
        if len(shape) == _MAX_RANK:
            raise TensorError(f"nested lists deeper than {_MAX_RANK} dimensions")
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    flat: list[bytes] = []

    def walk(node: Any, depth: int) -> None:
        if depth == len(shape):
            if isinstance(node, list):
                raise TensorError("nested lists are ragged (rows of different lengths)")
            flat.append(_string_element(node))
        elif not isinstance(node, list) or len(node) != shape[depth]:
            raise TensorError("nested lists are ragged (rows of different lengths)")
        else:
            for item in node:
                walk(item, depth + 1)

    walk(value, 0)
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(shape)


def _string_element(value: Any) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise TensorError("a string is not valid Unicode (a lone surrogate)") from None
    if isinstance(value, Mapping) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return pybase64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise TensorError(f"b64 is not valid base64 ({exc})") from None
    raise TensorError(
        f'expected strings (or {{"b64": ...}} for bytes) for dtype string, got {_json_type(value)}'
    )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def _flatten(value: Any) -> list[int]:
    if isinstance(value, list):
        return [item for row in value for item in _flatten(row)]
    return [value]


def _all_python_ints(value: Any) -> bool:
    if isinstance(value, list):
        return all(_all_python_ints(item) for item in value)
    return isinstance(value, int) and not isinstance(value, bool)


def encode(array: np.ndarray, *, encoding: str = "json") -> Any:
    """Encode an array for the wire, as nested lists or as a binary envelope.

    A string array is nested lists either way: of JSON strings where the bytes are UTF-8 (else
    `{"b64": ...}`) for "json", of `{"b64": ...}` for every element for "b64", which carries any
    bytes unchanged.
    """
    if is_string(array):
        binary = encoding == "b64"
        return _map_leaves(array.tolist(), lambda item: _wire_string(item, binary=binary))
    if encoding == "b64":
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        return {
            "b64": pybase64.b64encode(np.ascontiguousarray(little).tobytes()).decode("ascii"),
            "dtype": dtype_name(array.dtype),
            "shape": list(array.shape),
        }
    return array.tolist()


def _map_leaves(node: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(node, list):
        return [_map_leaves(item, fn) for item in node]
    return fn(node)


def _wire_string(item: Any, *, binary: bool) -> Any:
    if isinstance(item, str):
        if not binary:
            return item
        item = item.encode("utf-8")
    elif not isinstance(item, bytes):
        raise not_a_string(item)
    if not binary:
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"b64": pybase64.b64encode(item).decode("ascii")}
