"""Tensors on the wire and at rest, with NumPy only (no TensorFlow).

On the wire (the HTTP contract) a tensor is either nested JSON lists, batch dimension first, or
a binary envelope `{"b64": ..., "dtype": "float32", "shape": [n, ...]}` of C-order little-endian
bytes. At rest (the job row) a set of named tensors is packed into one blob: a small JSON header
followed by the raw bytes, so the worker reads it back without copying.

String tensors (dtype "string", as TensorFlow names tf.string) are NumPy object arrays of bytes,
as TensorFlow's `.numpy()` gives them. On the wire they are nested lists of JSON strings (UTF-8),
where an element may be `{"b64": ...}` for bytes that are not text (TF Serving's convention); no
binary envelope. At rest their entry holds each element's length, then the bytes one after another.

Large tensors also travel as binary bodies, NumPy's own files: an .npy (one array) or an .npz (an
uncompressed zip of .npy files, one per name), read as views of the body and written with one copy
of the arrays' bytes (`read_npz`, `write_npz`). Never pickled.
"""

from __future__ import annotations

import binascii
import io
import math
import struct
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson
import pybase64  # SIMD base64: decoding a 12 MB tensor takes 2 ms, not 50

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

_MAGIC = b"TFT1"
_HEADER_LEN = struct.Struct("<I")
# A packed string tensor: each element's length in bytes, then the elements' bytes.
_STRING_LENGTH = np.dtype("<u8")
# Nesting deeper than this is no tensor (NumPy's own limit is 64 dimensions).
_MAX_RANK = 32


class TensorError(ValueError):
    """A tensor that cannot be decoded; the message says why, without naming the input."""


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


def is_string(array: np.ndarray) -> bool:
    """Whether an array holds strings: bytes or str (objects, or NumPy's fixed-width S and U)."""
    return array.dtype.kind in "OSU"


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
            "dtype": array.dtype.name,
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
        raise _not_a_string(item)
    if not binary:
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"b64": pybase64.b64encode(item).decode("ascii")}


def _not_a_string(item: object) -> TensorError:
    return TensorError(
        f"an array of objects must hold str or bytes (a string tensor), got {type(item).__name__}"
    )


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
            dtype, raw = data.dtype.name, _raw(data)
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


def _raw(array: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes, without copying them (for `bytes.join`, `len`, `zlib`)."""
    return array.reshape(-1).view(np.uint8).data


def _pack_strings(name: str, array: np.ndarray) -> bytes:
    try:
        items = as_bytes(array).ravel().tolist()
    except TensorError as exc:
        raise TensorError(f"cannot pack {name!r}: {exc}") from None
    lengths = np.fromiter(map(len, items), dtype=_STRING_LENGTH, count=len(items))
    return lengths.tobytes() + b"".join(items)


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
            raise _not_a_string(item)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(array.shape)


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


def batch_size(tensors: Mapping[str, np.ndarray]) -> int:
    """Samples in a set of named tensors (all share the leading dimension)."""
    return int(next(iter(tensors.values())).shape[0]) if tensors else 0


# Binary bodies: NumPy's .npy (one array) and .npz (named arrays, an uncompressed zip of .npy
# files). Read without copying (the arrays are views of the body) and written with one copy (the
# arrays' bytes written into the body), so a large tensor costs a memcpy, not a parse. The zip is
# zipfile's, the .npy headers NumPy's (np.lib.format); what is ours is the checks.

NPY = "application/x-npy"
NPZ = "application/x-npz"
# The most members an .npz may have: each costs a few microseconds of Python to read.
MAX_NPZ_MEMBERS = 4096
# zipfile makes an object of every entry its central directory holds, however few the archive's
# end record counts, and only then can they be counted: a longer directory is refused before it
# reads it. A 64 MiB body of 47-byte entries would take 7 s; at this bound, 0.1 s at most. 128
# bytes a member: the 46 of its entry, and its name.
_NPZ_MAX_DIRECTORY = MAX_NPZ_MEMBERS * 128

_NPY_MAX_HEADER = 10_000  # np.load's own default limit (max_header_size)
_NPY_ALIGN = 64  # an array's bytes start at a multiple of this in what `write_npz` writes
# A zip member's local header: its signature, then (after 22 bytes of what the central directory
# also says) the lengths of its name and extra field, which lie between it and the data.
_ZIP_LOCAL = struct.Struct("<4s22xHH")
_ZIP_ENCRYPTED = 0x1  # a flag bit


def read_npy(data: bytes | memoryview) -> np.ndarray:
    """The array an .npy file holds: a read-only view of `data`, no copy. Never unpickles
    (an array of Python objects is refused)."""
    view = memoryview(data)
    head = _Head(view)
    try:
        version = np.lib.format.read_magic(head)
    except ValueError:
        raise TensorError("not an .npy array (no \\x93NUMPY magic string)") from None
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise TensorError(f".npy format {version[0]}.{version[1]} is not read (1.0 to 3.0 are)")
    # 3.0 differs from 2.0 only in that its header is UTF-8 (for structured dtypes' field names),
    # where 2.0's is Latin-1: a plain dtype's header is ASCII, the same bytes either way.
    read_header = np.lib.format.read_array_header_1_0
    if version != (1, 0):
        read_header = np.lib.format.read_array_header_2_0
    try:
        shape, fortran_order, dtype = read_header(head, max_header_size=_NPY_MAX_HEADER)
    # ValueError mostly; also SyntaxError or a DeprecationWarning (where warnings are errors) from
    # np.dtype, and tokenize's TokenError or RecursionError from parsing the header's dict.
    except Exception as exc:
        reason = str(exc).partition("\n")[0][:200]
        raise TensorError(
            f"the .npy header is not one NumPy reads ({type(exc).__name__}: {reason})"
        ) from None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TensorError(f"the .npy shape {shape!r} is not a tuple of non-negative integers")
    if dtype.hasobject:
        raise TensorError(
            "an array of Python objects would need pickle, which is refused; send strings as "
            "NumPy dtype S or U"
        )
    if dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0:
        raise TensorError(f"dtype {dtype} is no tensor's (structured, a subarray, or empty)")
    count = math.prod(shape)
    need, held = count * dtype.itemsize, len(view) - head.at
    if held != need:
        raise TensorError(
            f"holds {held} bytes of data but dtype {dtype.name} and shape {list(shape)} need {need}"
        )
    try:
        flat = np.frombuffer(view, dtype=dtype, count=count, offset=head.at)
        return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)
    except ValueError as exc:
        raise TensorError(f"shape {list(shape)} is not supported ({exc})") from None


class _Head:
    """The start of an .npy as the file np.lib.format's header readers read: each read copies
    only the bytes asked for (io.BytesIO would copy the whole body first); `at` ends where the
    data starts."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.at = view, 0

    def read(self, size: int = -1, /) -> bytes:
        chunk = bytes(self.view[self.at : None if size < 0 else self.at + size])
        self.at += len(chunk)
        return chunk


class _ZipBody(io.BytesIO):
    """A body as zipfile reads it (no copy of a bytes object), which refuses to hand it a central
    directory longer than _NPZ_MAX_DIRECTORY: zipfile reads the whole directory in one read."""

    def read(self, size: int | None = -1, /) -> bytes:
        if size is not None and size > _NPZ_MAX_DIRECTORY:
            raise TensorError(
                f"a zip directory of {size} bytes; an .npz of inputs holds at most "
                f"{MAX_NPZ_MEMBERS} members, in at most {_NPZ_MAX_DIRECTORY} bytes of directory"
            )
        return super().read(size)


def read_npz(body: bytes) -> dict[str, np.ndarray]:
    """The arrays an .npz (as `np.savez` writes it) holds, by name: read-only views of `body`.

    Members must be stored, not compressed (`np.savez`, not `np.savez_compressed`), and named
    NAME.npy. Their CRC-32 is not checked: the transport already guards the bytes, and checking
    would read every byte once more (which is why the data is sliced out of the body here rather
    than read through zipfile, which would also copy it).
    """
    try:
        with zipfile.ZipFile(_ZipBody(body)) as archive:
            members = archive.infolist()
    except TensorError:  # _ZipBody's refusal
        raise
    except (zipfile.BadZipFile, NotImplementedError, ValueError) as exc:
        raise TensorError(f"not an .npz archive ({exc})") from None
    if len(members) > MAX_NPZ_MEMBERS:
        raise TensorError(
            f"{len(members)} members; an .npz of inputs holds at most {MAX_NPZ_MEMBERS}"
        )
    view = memoryview(body)
    arrays: dict[str, np.ndarray] = {}
    for member in members:
        where = f"member {member.filename!r}"
        if not member.filename.endswith(".npy"):
            raise TensorError(f"{where} is not an .npy array (np.savez names them NAME.npy)")
        name = member.filename[: -len(".npy")]
        if name in arrays:
            raise TensorError(f"{where} appears twice")
        if member.flag_bits & _ZIP_ENCRYPTED:
            raise TensorError(f"{where} is encrypted")
        if member.compress_type != zipfile.ZIP_STORED:
            raise TensorError(
                f"{where} is compressed; send what np.savez writes, not np.savez_compressed"
            )
        local_at = member.header_offset
        if not 0 <= local_at <= len(body) - _ZIP_LOCAL.size:
            raise TensorError(f"{where}: its header lies outside the body")
        signature, name_len, extra_len = _ZIP_LOCAL.unpack_from(body, local_at)
        if signature != b"PK\x03\x04":
            raise TensorError(f"{where}: no zip header where the directory says it starts")
        start = local_at + _ZIP_LOCAL.size + name_len + extra_len
        if start + member.compress_size > len(body):
            raise TensorError(f"{where}: its data runs past the end of the body")
        try:
            arrays[name] = read_npy(view[start : start + member.compress_size])
        except TensorError as exc:
            raise TensorError(f"{where}: {exc}") from None
    return arrays


def write_npy(array: np.ndarray) -> bytes:
    """`array` as an .npy file (what np.save writes, read back by np.load): one copy."""
    data = _fixed_width("array", array)
    return b"".join([_npy_header(data, start=0), _raw(data)])


def write_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Named arrays as an .npz (what np.savez writes, read back by np.load): one copy of their
    bytes, each starting 64-byte aligned. TensorError for strings or other dtypes without a
    fixed width."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # stored, not compressed
        for name, array in arrays.items():
            data = _fixed_width(name, array)
            # A ZipInfo of our own: its date is 1980-01-01 (the same arrays, the same bytes), and
            # its size, known in advance, has zipfile write zip64 sizes where they need them
            # (past 4 GiB, with 5% to spare: the header's hundred bytes are within that).
            member = zipfile.ZipInfo(f"{name}.npy")
            member.file_size = data.nbytes
            with archive.open(member, "w") as out:
                # zipfile has written the member's local header: its data starts here.
                out.write(_npy_header(data, start=buffer.tell()))
                out.write(_raw(data))
    return buffer.getvalue()


def npz_of_blob(blob: bytes) -> bytes:
    """A packed blob (`pack`) as an .npz: its arrays' bytes copied once, straight into it."""
    return write_npz(unpack(blob))


def _fixed_width(name: str, array: np.ndarray) -> np.ndarray:
    if is_string(array) or array.dtype.name not in DTYPES:
        raise TensorError(
            f"cannot write {name!r} as .npy: dtype {array.dtype.name} is not a fixed-width "
            "number or bool"
        )
    return array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)


def _npy_header(array: np.ndarray, *, start: int) -> bytes:
    """An .npy header (format 1.0) padded so that the data after it starts at a multiple of
    _NPY_ALIGN from the start of the body it lies in (`start`: where the header begins).
    np.lib.format's own writer pads to a multiple from the header's start, wherever that lies."""
    descr = np.lib.format.dtype_to_descr(array.dtype)
    fields = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(array.shape)!r}, }}"
    magic = np.lib.format.magic(1, 0)
    pad = -(start + len(magic) + 2 + len(fields) + 1) % _NPY_ALIGN
    text = (fields + " " * pad + "\n").encode("latin-1")
    return magic + len(text).to_bytes(2, "little") + text


def from_array(array: np.ndarray, *, dtype: str) -> np.ndarray:
    """An array read from a binary body, checked against a signature's `dtype` (as `decode` does
    a wire tensor): the same array, or for strings an object array of bytes."""
    if dtype == STRING:
        if array.dtype.kind not in "OSU":
            raise TensorError(
                f"expected strings (NumPy dtype S or U, or objects that are bytes or str) for "
                f"dtype string, got {array.dtype.name}"
            )
        return as_bytes(array)
    if array.dtype.name != dtype or array.dtype.kind == "V":
        raise TensorError(f"expected dtype {dtype}, got {array.dtype.name}")
    if array.dtype.kind == "b" and array.size and array.view(np.uint8).max() > 1:
        raise TensorError("a bool tensor's bytes must each be 0 or 1")
    return array
