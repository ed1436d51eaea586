"""Tensors as binary bodies, NumPy's own files: an .npy (one array) or an .npz (named arrays, an
uncompressed zip of .npy files, one per name). Never pickled.

Read without copying (the arrays are views of the body) and written with one copy (the arrays'
bytes written into the body), so a large tensor costs a memcpy, not a parse. The zip is
zipfile's, the .npy headers NumPy's (np.lib.format); what is ours is the checks.
"""

from __future__ import annotations

import io
import math
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tffleet.tensors.arrays import DTYPES, STRING, TensorError, as_bytes, is_string, raw_bytes
from tffleet.tensors.packed import Reference, unpack

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


@dataclass(frozen=True)
class NpyHeader:
    """What an .npy header says: its array's dtype and shape, and where its data starts."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran_order: bool
    offset: int  # the header's length: the data's first byte

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def npy_header_size(prefix: bytes | memoryview) -> int:
    """How many bytes an .npy's header takes, read from its first 12 (fewer only if the body is
    that short): what to read before `read_npy_header`, when the body arrives in chunks."""
    view = memoryview(prefix)
    if bytes(view[:6]) != b"\x93NUMPY" or len(view) < 10:
        raise TensorError("not an .npy array (no \\x93NUMPY magic string)")
    if view[6] == 1:
        return 10 + int.from_bytes(view[8:10], "little")
    if len(view) < 12:
        raise TensorError("the .npy header is cut short")
    return 12 + int.from_bytes(view[8:12], "little")


def read_npy_header(data: bytes | memoryview) -> NpyHeader:
    """The header at the start of `data` (the whole .npy, or its first `npy_header_size`
    bytes), checked as `read_npy` checks it; the data is not read."""
    head = _Head(memoryview(data))
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
    return NpyHeader(dtype, tuple(shape), bool(fortran_order), head.at)


def read_npy(data: bytes | memoryview) -> np.ndarray:
    """The array an .npy file holds: a read-only view of `data`, no copy. Never unpickles
    (an array of Python objects is refused)."""
    view = memoryview(data)
    header = read_npy_header(view)
    shape, dtype = header.shape, header.dtype
    count = math.prod(shape)
    need, held = header.nbytes, len(view) - header.offset
    if held != need:
        raise TensorError(
            f"holds {held} bytes of data but dtype {dtype.name} and shape {list(shape)} need {need}"
        )
    try:
        flat = np.frombuffer(view, dtype=dtype, count=count, offset=header.offset)
        return flat.reshape(shape[::-1]).T if header.fortran_order else flat.reshape(shape)
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
    return b"".join([_npy_header(data, start=0), raw_bytes(data)])


def npy_object(key: str, array: np.ndarray) -> tuple[bytes, Reference]:
    """`array` as a whole .npy object to put at `key`, and the reference to it a job's blob
    holds (its bytes start after the header: `offset`)."""
    data = write_npy(array)
    reference = Reference(
        key=key,
        dtype=array.dtype.name,
        shape=tuple(array.shape),
        offset=len(data) - array.nbytes,
        nbytes=array.nbytes,
    )
    return data, reference


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
                out.write(raw_bytes(data))
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
