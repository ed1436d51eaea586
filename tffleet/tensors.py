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

import ast
import binascii
import math
import struct
import zlib
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
# arrays' bytes joined into the body), so a large tensor costs a memcpy, not a parse.

NPY = "application/x-npy"
NPZ = "application/x-npz"
# The most members an .npz may have: each costs a few microseconds of Python to read.
MAX_NPZ_MEMBERS = 4096

_NPY_MAGIC = b"\x93NUMPY"
_NPY_MAX_HEADER = 10_000  # np.load's own default limit (max_header_size)
_NPY_ALIGN = 64  # an array's bytes start at a multiple of this in what `write_npz` writes
_U16, _U32 = struct.Struct("<H"), struct.Struct("<I")
_ZIP_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # local file header (30 bytes), then name and extra
_ZIP_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # central directory entry (46 bytes)
_ZIP_END = struct.Struct("<4sHHHHIIH")  # end of central directory (22 bytes)
_ZIP64_LOCATOR = struct.Struct("<4sIQI")  # zip64 end of central directory locator (20 bytes)
_ZIP64_END = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory (56 bytes)
_ZIP_LOCAL_SIG, _ZIP_CENTRAL_SIG, _ZIP_END_SIG = b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06"
_ZIP_STORED, _ZIP_ENCRYPTED, _ZIP_UTF8 = 0, 0x1, 0x800
_ZIP_DOS_DATE = 0x21  # 1980-01-01, the earliest a zip can say
_ZIP_MAX = 0xFFFFFFFF


def read_npy(data: bytes | memoryview) -> np.ndarray:
    """The array an .npy file holds: a read-only view of `data`, no copy. Never unpickles
    (an array of Python objects is refused)."""
    view = memoryview(data)
    offset, shape, fortran_order, dtype = _npy_header_fields(view)
    count = math.prod(shape)
    need, held = count * dtype.itemsize, len(view) - offset
    if held != need:
        raise TensorError(
            f"holds {held} bytes of data but dtype {dtype.name} and shape {list(shape)} need {need}"
        )
    try:
        flat = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
        return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)
    except ValueError as exc:
        raise TensorError(f"shape {list(shape)} is not supported ({exc})") from None


def _npy_header_fields(view: memoryview) -> tuple[int, tuple[int, ...], bool, np.dtype[Any]]:
    """Where the data starts, and the shape, order and dtype an .npy header gives. Parsed
    here, not by np.lib.format, whose fallback for Python 2 headers warns on a malformed one."""
    if len(view) < 10 or view[:6] != _NPY_MAGIC:
        raise TensorError("not an .npy array (no \\x93NUMPY magic string)")
    version = (view[6], view[7])
    if version == (1, 0):
        (length,), start = _U16.unpack_from(view, 8), 10
    elif version in ((2, 0), (3, 0)) and len(view) >= 12:
        (length,), start = _U32.unpack_from(view, 8), 12
    else:
        raise TensorError(f".npy format {version[0]}.{version[1]} is not read (1.0 to 3.0 are)")
    if length > _NPY_MAX_HEADER or start + length > len(view):
        raise TensorError(f"an .npy header of {length} bytes is too long or cut short")
    text = bytes(view[start : start + length]).decode(
        "utf-8" if version == (3, 0) else "latin-1", errors="replace"
    )
    try:
        fields = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TensorError("the .npy header is not a Python dict literal") from None
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        raise TensorError("the .npy header needs exactly the keys descr, fortran_order, shape")
    descr, fortran_order, shape = fields["descr"], fields["fortran_order"], fields["shape"]
    if not isinstance(shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise TensorError(f"the .npy shape {shape!r} is not a tuple of non-negative integers")
    if not isinstance(fortran_order, bool):
        raise TensorError("the .npy fortran_order is not True or False")
    if not isinstance(descr, str):
        raise TensorError(f"dtype {descr!r} is structured; a tensor has one plain dtype")
    try:
        dtype = np.dtype(descr)
    # TypeError, ValueError, SyntaxError (from its comma-string parser); a deprecated alias's
    # Warning where warnings are errors.
    except Exception:
        raise TensorError(f"the .npy dtype {descr!r} is not one NumPy knows") from None
    if dtype.hasobject:
        raise TensorError(
            "an array of Python objects would need pickle, which is refused; send strings as "
            "NumPy dtype S or U"
        )
    if dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0:
        raise TensorError(f"dtype {dtype} is no tensor's (structured, a subarray, or empty)")
    return start + length, shape, fortran_order, dtype


def read_npz(body: bytes) -> dict[str, np.ndarray]:
    """The arrays an .npz (as `np.savez` writes it) holds, by name: read-only views of `body`.

    Members must be stored, not compressed (`np.savez`, not `np.savez_compressed`), and named
    NAME.npy. Their CRC-32 is not checked: the transport already guards the bytes, and checking
    would read every byte once more.
    """
    view = memoryview(body)
    arrays: dict[str, np.ndarray] = {}
    for filename, flags, method, local_at, size in _zip_members(body):
        where = f"member {filename!r}"
        if not filename.endswith(".npy"):
            raise TensorError(f"{where} is not an .npy array (np.savez names them NAME.npy)")
        name = filename[: -len(".npy")]
        if name in arrays:
            raise TensorError(f"{where} appears twice")
        if flags & _ZIP_ENCRYPTED:
            raise TensorError(f"{where} is encrypted")
        if method != _ZIP_STORED:
            raise TensorError(
                f"{where} is compressed; send what np.savez writes, not np.savez_compressed"
            )
        if local_at + _ZIP_LOCAL.size > len(body):
            raise TensorError(f"{where}: its header lies past the end of the body")
        local = _ZIP_LOCAL.unpack_from(body, local_at)
        if local[0] != _ZIP_LOCAL_SIG:
            raise TensorError(f"{where}: no zip header where the directory says it starts")
        start = local_at + _ZIP_LOCAL.size + local[9] + local[10]
        if start + size > len(body):
            raise TensorError(f"{where}: its data runs past the end of the body")
        try:
            arrays[name] = read_npy(view[start : start + size])
        except TensorError as exc:
            raise TensorError(f"{where}: {exc}") from None
    return arrays


def _zip_members(body: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, flags, method, local header offset, stored size) of each member, in order, read
    off the central directory; at most MAX_NPZ_MEMBERS, checked before any is read."""
    end = body.rfind(_ZIP_END_SIG, max(0, len(body) - _ZIP_END.size - 0xFFFF))
    if end < 0 or end + _ZIP_END.size > len(body):
        raise TensorError("not an .npz archive (no zip end of central directory record)")
    _, disk, cd_disk, _, count, cd_size, cd_at, _ = _ZIP_END.unpack_from(body, end)
    locator = end - _ZIP64_LOCATOR.size
    if locator >= 0 and body[locator : locator + 4] == b"PK\x06\x07":
        _, _, zip64_at, _ = _ZIP64_LOCATOR.unpack_from(body, locator)
        if zip64_at + _ZIP64_END.size > len(body) or body[zip64_at : zip64_at + 4] != b"PK\x06\x06":
            raise TensorError("not an .npz archive (a broken zip64 end record)")
        _, _, _, _, disk, cd_disk, _, count, cd_size, cd_at = _ZIP64_END.unpack_from(body, zip64_at)
    if disk or cd_disk:
        raise TensorError("a zip archive split over several disks is not an .npz")
    if count > MAX_NPZ_MEMBERS:
        raise TensorError(f"{count} members; an .npz of inputs holds at most {MAX_NPZ_MEMBERS}")
    if cd_at + cd_size > len(body):
        raise TensorError("not an .npz archive (its directory lies past the end of the body)")
    members = []
    at = cd_at
    for _ in range(count):
        if at + _ZIP_CENTRAL.size > cd_at + cd_size:
            raise TensorError("not an .npz archive (its directory ends early)")
        entry = _ZIP_CENTRAL.unpack_from(body, at)
        if entry[0] != _ZIP_CENTRAL_SIG:
            raise TensorError("not an .npz archive (a broken directory entry)")
        flags, method, size, name_len, extra_len, comment_len, local_at = (
            entry[3], entry[4], entry[8], entry[10], entry[11], entry[12], entry[16]
        )  # fmt: skip
        raw_name = body[at + _ZIP_CENTRAL.size : at + _ZIP_CENTRAL.size + name_len]
        extra = body[
            at + _ZIP_CENTRAL.size + name_len : at + _ZIP_CENTRAL.size + name_len + extra_len
        ]
        if size == _ZIP_MAX or local_at == _ZIP_MAX:
            size, local_at = _zip64_extra(extra, entry[9], size, local_at)
        name = raw_name.decode("utf-8" if flags & _ZIP_UTF8 else "cp437", errors="replace")
        members.append((name, flags, method, local_at, size))
        at += _ZIP_CENTRAL.size + name_len + extra_len + comment_len
    return members


def _zip64_extra(extra: bytes, file_size: int, size: int, local_at: int) -> tuple[int, int]:
    """A member's stored size and header offset from its zip64 extra field (only the fields
    whose 32-bit slot holds 0xFFFFFFFF are there, in this order)."""
    at = 0
    while at + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, at)
        if tag == 1:
            values = [v for (v,) in struct.iter_unpack("<Q", extra[at + 4 : at + 4 + length])]
            wanted = [file_size == _ZIP_MAX, size == _ZIP_MAX, local_at == _ZIP_MAX]
            if len(values) < sum(wanted):
                break
            got = iter(values)
            found = [next(got) if w else None for w in wanted]
            return (
                size if found[1] is None else found[1],
                local_at if found[2] is None else found[2],
            )
        at += 4 + length
    raise TensorError("not an .npz archive (a zip64 member without its zip64 sizes)")


def write_npy(array: np.ndarray) -> bytes:
    """`array` as an .npy file (what np.save writes, read back by np.load): one copy."""
    data = _fixed_width("array", array)
    return b"".join([_npy_header(data, start=0), _raw(data)])


def write_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Named arrays as an .npz (what np.savez writes, read back by np.load): one copy of their
    bytes, each starting 64-byte aligned. TensorError for strings or other dtypes without a
    fixed width."""
    parts: list[bytes | memoryview] = []
    central = []
    offset = 0
    for name, array in arrays.items():
        data = _fixed_width(name, array)
        filename = f"{name}.npy".encode()
        flags = 0 if filename.isascii() else _ZIP_UTF8
        head = _npy_header(data, start=offset + _ZIP_LOCAL.size + len(filename))
        raw = _raw(data)
        crc = zlib.crc32(raw, zlib.crc32(head))
        size = len(head) + len(raw)
        if size >= _ZIP_MAX or offset >= _ZIP_MAX:
            raise TensorError(f"cannot write {name!r}: over 4 GiB, too large for an .npz here")
        fields = (0, 0, _ZIP_DOS_DATE, crc, size, size, len(filename))
        parts += [_ZIP_LOCAL.pack(_ZIP_LOCAL_SIG, 20, flags, *fields, 0), filename, head, raw]
        central += [
            _ZIP_CENTRAL.pack(_ZIP_CENTRAL_SIG, 20, 20, flags, *fields, 0, 0, 0, 0, 0, offset)
        ]
        central += [filename]
        offset += _ZIP_LOCAL.size + len(filename) + size
    directory = b"".join(central)
    count = len(arrays)
    if count > 0xFFFF:
        raise TensorError(f"cannot write {count} arrays into one .npz here")
    end = _ZIP_END.pack(_ZIP_END_SIG, 0, 0, count, count, len(directory), offset, 0)
    return b"".join([*parts, directory, end])


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
    _NPY_ALIGN from the start of the body it lies in (`start`: where the header begins)."""
    descr = np.lib.format.dtype_to_descr(array.dtype)
    fields = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(array.shape)!r}, }}"
    fixed = len(_NPY_MAGIC) + 2 + _U16.size
    pad = -(start + fixed + len(fields) + 1) % _NPY_ALIGN
    text = (fields + " " * pad + "\n").encode("latin-1")
    return _NPY_MAGIC + b"\x01\x00" + _U16.pack(len(text)) + text


def from_array(array: np.ndarray, *, dtype: str) -> np.ndarray:
    """An array read from a binary body, checked against a signature's `dtype` (as `decode` does
    a wire tensor): the same array, or for strings an object array of bytes."""
    if dtype == STRING:
        if array.dtype.kind not in "SU":
            raise TensorError(
                f"expected strings (NumPy dtype S or U) for dtype string, got {array.dtype.name}"
            )
        return as_bytes(array)
    if array.dtype.name != dtype or array.dtype.kind == "V":
        raise TensorError(f"expected dtype {dtype}, got {array.dtype.name}")
    if array.dtype.kind == "b" and array.size and array.view(np.uint8).max() > 1:
        raise TensorError("a bool tensor's bytes must each be 0 or 1")
    return array
