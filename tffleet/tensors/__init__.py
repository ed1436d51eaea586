"""Tensors on the wire and at rest, with NumPy only (no TensorFlow): a module per form.

    arrays.py   what the forms share: the dtypes (`DTYPES`, `STRING`), `TensorError`, string
                arrays as TensorFlow holds them (object arrays of bytes)
    wire.py     in a JSON body: nested lists, or a `{"b64", "dtype", "shape"}` envelope
                (`decode`, `encode`)
    npy.py      as a binary body: NumPy's .npy and .npz, read as views and written with one copy
                (`read_npy`, `read_npz`, `write_npy`, `write_npz`, `from_array`); an .npy's
                header alone, for a body streamed on (`npy_header_size`, `read_npy_header`)
    packed.py   at rest: named tensors in one blob, a JSON header then the raw bytes, or a
                `Reference` into an object of the store (`pack`, `unpack`, `references`)

Callers take the names from here (`from tffleet import tensors`, `tensors.pack(...)`); the
modules import one another, never this package.
"""

from tffleet.tensors.arrays import (
    DTYPES,
    STRING,
    SUPPORTED_DTYPES,
    TensorError,
    as_bytes,
    batch_size,
    dtype_name,
    is_string,
)
from tffleet.tensors.npy import (
    MAX_NPZ_MEMBERS,
    NPY,
    NPZ,
    NpyHeader,
    from_array,
    npy_header_size,
    npy_object,
    npz_of_blob,
    read_npy,
    read_npy_header,
    read_npz,
    write_npy,
    write_npz,
)
from tffleet.tensors.packed import MissingObject, Reference, pack, references, unpack
from tffleet.tensors.wire import decode, encode

__all__ = [
    "DTYPES",
    "MAX_NPZ_MEMBERS",
    "NPY",
    "NPZ",
    "STRING",
    "SUPPORTED_DTYPES",
    "MissingObject",
    "NpyHeader",
    "Reference",
    "TensorError",
    "as_bytes",
    "batch_size",
    "decode",
    "dtype_name",
    "encode",
    "from_array",
    "is_string",
    "npy_header_size",
    "npy_object",
    "npz_of_blob",
    "pack",
    "read_npy",
    "read_npy_header",
    "read_npz",
    "references",
    "unpack",
    "write_npy",
    "write_npz",
]
