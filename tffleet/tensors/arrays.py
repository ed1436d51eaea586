"""What every form of a tensor shares: the dtypes a tensor may have, `TensorError`, and NumPy
arrays as the forms take them (strings as TensorFlow holds them, a C-order array's raw bytes).

String tensors (dtype "string", as TensorFlow names tf.string) are NumPy object arrays of bytes,
as TensorFlow's `.numpy()` gives them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

# The fixed-width dtypes, by their NumPy/TensorFlow name: those with raw bytes (and envelopes).
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
# A string tensor's dtype name; NumPy holds it as an object array of bytes.
STRING = "string"
# Every dtype a signature may name.
SUPPORTED_DTYPES = frozenset({*DTYPES, STRING})
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class TensorError(ValueError):
    """A tensor that cannot be decoded; the message says why, without naming the input."""


def dtype_name(dtype: np.dtype[Any]) -> str:
    """`dtype.name`, looked up for a supported dtype in its little-endian form: NumPy builds the
    name in Python on each read (1.5 us), and a job's path reads it for every tensor."""
    return _NAMES.get(dtype) or dtype.name


def is_string(array: np.ndarray) -> bool:
    """Whether an array holds strings: bytes or str (objects, or NumPy's fixed-width S and U)."""
    return array.dtype.kind in "OSU"


def as_bytes(array: np.ndarray) -> np.ndarray:
    """An array of str or bytes as TensorFlow's form of a string tensor: an object array of bytes
    (str encoded as UTF-8). NumPy's fixed-width bytes (dtype S) drop trailing NUL bytes."""
    items = array.ravel().tolist()
    for i, item in enumerate(items):
        if isinstance(item, str):
            try:
                items[i] = item.encode("utf-8")
            except UnicodeEncodeError:
                raise TensorError("a string is not valid Unicode (a lone surrogate)") from None
        elif not isinstance(item, bytes):
            raise not_a_string(item)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(array.shape)


def not_a_string(item: object) -> TensorError:
    return TensorError(
        f"an array of objects must hold str or bytes (a string tensor), got {type(item).__name__}"
    )


def raw_bytes(array: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes, without copying them (for `bytes.join`, `len`, `zlib`)."""
    return array.reshape(-1).view(np.uint8).data


def batch_size(tensors: Mapping[str, np.ndarray]) -> int:
    """Samples in a set of named tensors (all share the leading dimension)."""
    return int(next(iter(tensors.values())).shape[0]) if tensors else 0
