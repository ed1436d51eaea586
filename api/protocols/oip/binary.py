"""The binary tensor data extension's bytes: a tensor's elements little-endian and row-major,
BOOL one byte each, BYTES each element a 4-byte little-endian length and its bytes.

Pure functions: api/protocols/oip/codec.py reads and writes infer bodies with them.
"""

from __future__ import annotations

import struct

import numpy as np

from tffleet import tensors
from tffleet.errors import InvalidInput, InvalidRequest, PayloadTooLarge

_LENGTH = struct.Struct("<I")


def from_binary(data: memoryview, dtype: str, count: int, where: str) -> np.ndarray:
    """One input's binary data as a flat array of `count` elements of the signature's `dtype`;
    400 or 422 naming `where` if the bytes do not hold them."""
    if dtype == tensors.STRING:
        return _strings(data, count, where)
    element = np.dtype(numpy_dtype(dtype)).newbyteorder("<")
    if len(data) != count * element.itemsize:
        raise InvalidRequest(
            f"{where}.parameters.binary_data_size: {len(data)} bytes, the shape holds {count} "
            f"elements of {element.itemsize} bytes ({count * element.itemsize})"
        )
    array = np.frombuffer(data, dtype=element)
    if dtype == "bool" and array.size and array.view(np.uint8).max() > 1:
        raise InvalidInput(f"{where}: a BOOL element's byte must be 0 or 1")
    return array.astype(element.newbyteorder("="), copy=False)


# BYTES elements one binary input may hold: each is read in Python, about 0.3 s per million
# here, so a body of millions of empty strings would hold a thread for seconds.
MAX_STRING_ELEMENTS = 250_000


def _strings(data: memoryview, count: int, where: str) -> np.ndarray:
    if count > MAX_STRING_ELEMENTS:
        raise PayloadTooLarge(
            f"{where}: {count} BYTES elements; an input holds at most {MAX_STRING_ELEMENTS} "
            "(split the request)"
        )
    items: list[bytes] = []
    at = 0
    while at < len(data):
        if at + 4 > len(data):
            raise InvalidRequest(f"{where}: BYTES element {len(items)} has a cut length")
        (length,) = _LENGTH.unpack_from(data, at)
        at += 4
        if at + length > len(data):
            raise InvalidRequest(f"{where}: BYTES element {len(items)} runs past its data")
        items.append(bytes(data[at : at + length]))
        at += length
    if len(items) != count:
        raise InvalidInput(f"{where}: {len(items)} BYTES elements, the shape holds {count}")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


def numpy_dtype(dtype: str) -> str:
    """The NumPy dtype that holds a signature's dtype (strings: Python objects)."""
    return "object" if dtype == tensors.STRING else dtype


def to_binary(array: np.ndarray) -> bytes:
    """An output's binary data, as `from_binary` reads it."""
    if tensors.is_string(array):
        items = tensors.as_bytes(array).reshape(-1)
        return b"".join(_LENGTH.pack(len(item)) + item for item in items)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return np.ascontiguousarray(little).tobytes()
