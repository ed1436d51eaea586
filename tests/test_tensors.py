"""The wire codec (nested lists or base64 envelopes) and the packed blobs stored with a job."""

from __future__ import annotations

import base64
import contextlib
import io
import random
import re
import struct
import zipfile
from typing import Any

import numpy as np
import pytest

from tffleet import tensors
from tffleet.tensors import DTYPES, TensorError, decode, encode, npy, pack, unpack

SAMPLE = [[1, 0, 3], [4, 5, 1]]


def envelope(array: np.ndarray, **overrides: Any) -> dict[str, Any]:
    raw = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"))).tobytes()
    value: dict[str, Any] = {
        "b64": base64.b64encode(raw).decode(),
        "dtype": array.dtype.name,
        "shape": list(array.shape),
    }
    value.update(overrides)
    return value


# decode: nested lists


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_decode_lists_gives_the_signature_dtype(dtype: str) -> None:
    value = [[True, False], [False, True]] if dtype == "bool" else SAMPLE
    array = decode(value, dtype=dtype)
    assert array.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(array, np.array(value, dtype=dtype))


def test_decode_lists_accepts_integers_for_float_inputs() -> None:
    array = decode([[1, 2.5]], dtype="float32")
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array, [[1.0, 2.5]])


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint64"])
def test_decode_lists_rejects_floats_for_integer_inputs(dtype: str) -> None:
    with pytest.raises(TensorError, match=f"expected integers for dtype {dtype}"):
        decode([[1, 2.0]], dtype=dtype)


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        ([128], "int8"),
        ([-129], "int8"),
        ([-1], "uint8"),
        ([256], "uint8"),
        ([2**31], "int32"),
        ([2**63], "int64"),
        ([-1, 2**63], "int64"),  # NumPy reads this mix as float64
        ([2**64], "uint64"),  # and this one as objects
        ([[1], [2**100]], "int64"),
    ],
)
def test_decode_lists_rejects_integers_out_of_range(value: list[Any], dtype: str) -> None:
    with pytest.raises(TensorError, match=f"integer out of range for dtype {dtype}"):
        decode(value, dtype=dtype)


def test_decode_lists_accepts_the_integer_range_limits() -> None:
    np.testing.assert_array_equal(
        decode([-(2**63), 2**63 - 1], dtype="int64"), [-(2**63), 2**63 - 1]
    )
    assert decode([0, 2**64 - 1], dtype="uint64")[1] == 2**64 - 1


@pytest.mark.parametrize(("value", "dtype"), [([1e39], "float32"), ([70000], "float16")])
def test_decode_lists_rejects_numbers_beyond_a_float_dtype(value: list[Any], dtype: str) -> None:
    with pytest.raises(TensorError, match=f"out of range for dtype {dtype}"):
        decode(value, dtype=dtype)


def test_decode_lists_of_true_false_only_for_bool_inputs() -> None:
    np.testing.assert_array_equal(decode([True, False], dtype="bool"), [True, False])
    with pytest.raises(TensorError, match="true/false"):
        decode([1, 0], dtype="bool")
    with pytest.raises(TensorError, match="integers"):
        decode([True], dtype="int32")
    with pytest.raises(TensorError, match="numbers"):
        decode([True], dtype="float32")
    with pytest.raises(TensorError, match="expected true/false for dtype bool"):
        decode(["true"], dtype="bool")


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        ([True, 2], "float32"),  # NumPy reads this as the integers [1, 2]
        ([[1.5, False]], "float64"),
        ([[1], [True]], "int64"),
        ([0, True], "uint8"),
    ],
)
def test_decode_lists_refuses_true_false_among_numbers(value: list[Any], dtype: str) -> None:
    with pytest.raises(TensorError, match=r"expected (numbers|integers) .*, got true/false"):
        decode(value, dtype=dtype)


def test_decode_lists_says_strings_are_not_numbers() -> None:
    with pytest.raises(TensorError, match="expected numbers of dtype float32, got strings"):
        decode([["1.5"]], dtype="float32")


@pytest.mark.parametrize("value", [[[1, 2], [3]], [[1, 2], 3], [[[1]], [[1, 2]]]])
def test_decode_lists_rejects_ragged_rows(value: list[Any]) -> None:
    with pytest.raises(TensorError, match="ragged"):
        decode(value, dtype="float32")


@pytest.mark.parametrize("value", [["a", "b"], [1, "2"], [[1, None]], [{"x": 1}]])
def test_decode_lists_rejects_strings_and_other_non_numbers(value: list[Any]) -> None:
    with pytest.raises(TensorError, match="expected numbers of dtype float32"):
        decode(value, dtype="float32")


@pytest.mark.parametrize("value", [1.5, "1,2", None, (1, 2)])
def test_decode_rejects_what_is_neither_lists_nor_an_envelope(value: Any) -> None:
    with pytest.raises(TensorError, match="nested lists or a"):
        decode(value, dtype="float32")


def test_decode_empty_lists_keeps_their_shape() -> None:
    assert decode([], dtype="int32").shape == (0,)
    array = decode([[], []], dtype="float32")
    assert (array.shape, array.dtype) == ((2, 0), np.float32)


# decode: binary envelopes


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_decode_envelope_of_each_dtype(dtype: str) -> None:
    original = np.array(SAMPLE, dtype=dtype)
    array = decode(envelope(original), dtype=dtype)
    assert array.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(array, original)


def test_decode_envelope_reads_little_endian_bytes() -> None:
    raw = (1).to_bytes(4, "little") + (256).to_bytes(4, "little")
    value = {"b64": base64.b64encode(raw).decode(), "dtype": "int32", "shape": [2]}
    np.testing.assert_array_equal(decode(value, dtype="int32"), [1, 256])


def test_decode_envelope_of_an_empty_batch() -> None:
    array = decode(envelope(np.zeros((0, 3), dtype=np.float32)), dtype="float32")
    assert array.shape == (0, 3)


def test_decode_envelope_rejects_a_dtype_other_than_the_signatures() -> None:
    value = envelope(np.zeros(2, dtype=np.float64))
    with pytest.raises(TensorError, match="expected dtype float32, got 'float64'"):
        decode(value, dtype="float32")


@pytest.mark.parametrize("b64", ["not base64!", "AAA", "AA==AA==", 12])
def test_decode_envelope_rejects_bad_base64(b64: Any) -> None:
    with pytest.raises(TensorError, match="b64"):
        decode({"b64": b64, "dtype": "uint8", "shape": [2]}, dtype="uint8")


def test_decode_envelope_rejects_a_byte_count_that_does_not_fit_the_shape() -> None:
    value = envelope(np.zeros((2, 3), dtype=np.float32), shape=[2, 4])
    with pytest.raises(TensorError, match=r"holds 24 bytes but dtype float32 and shape .* need 32"):
        decode(value, dtype="float32")


def test_decode_envelope_rejects_a_huge_shape_whose_int64_product_wraps_to_zero() -> None:
    value = {"b64": "", "dtype": "uint8", "shape": [2**32, 2**32]}
    with pytest.raises(TensorError, match="need 18446744073709551616"):
        decode(value, dtype="uint8")


def test_decode_envelope_rejects_an_empty_shape_numpy_cannot_hold() -> None:
    with pytest.raises(TensorError, match="shape"):
        decode({"b64": "", "dtype": "uint8", "shape": [0, 2**70]}, dtype="uint8")


@pytest.mark.parametrize("shape", [[2, -1], [2.0], "2", [True], None])
def test_decode_envelope_rejects_a_shape_that_is_not_non_negative_integers(shape: Any) -> None:
    with pytest.raises(TensorError, match="shape must be a list of non-negative integers"):
        decode({"b64": "AAA=", "dtype": "uint8", "shape": shape}, dtype="uint8")


@pytest.mark.parametrize(
    "value",
    [
        {"b64": "AA==", "dtype": "uint8"},
        {"b64": "AA==", "dtype": "uint8", "shape": [1], "extra": 1},
        {},
    ],
)
def test_decode_envelope_needs_exactly_its_three_keys(value: dict[str, Any]) -> None:
    with pytest.raises(TensorError, match="exactly the keys b64, dtype and shape"):
        decode(value, dtype="uint8")


def test_decode_envelope_of_bool_accepts_only_zero_and_one_bytes() -> None:
    good = {"b64": base64.b64encode(b"\x00\x01").decode(), "dtype": "bool", "shape": [2]}
    np.testing.assert_array_equal(decode(good, dtype="bool"), [False, True])
    bad = {"b64": base64.b64encode(b"\x00\x02").decode(), "dtype": "bool", "shape": [2]}
    with pytest.raises(TensorError, match="0 or 1"):
        decode(bad, dtype="bool")


# encode


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("encoding", ["json", "b64"])
def test_encode_then_decode_gives_back_the_array(dtype: str, encoding: str) -> None:
    values = [[True, False, True], [False, True, True]] if dtype == "bool" else SAMPLE
    original = np.array(values, dtype=dtype)
    array = decode(encode(original, encoding=encoding), dtype=dtype)
    assert array.dtype == original.dtype
    np.testing.assert_array_equal(array, original)


def test_encode_keeps_float32_values_exactly_through_json() -> None:
    original = np.array([0.1, 1 / 3, 3.4e38, -1e-30], dtype=np.float32)
    np.testing.assert_array_equal(decode(encode(original), dtype="float32"), original)


def test_encode_b64_writes_little_endian_c_order_bytes() -> None:
    big_endian = np.array([[1, 2], [3, 4]], dtype=">i4").T  # neither little nor C-ordered
    value = encode(big_endian, encoding="b64")
    assert value["dtype"] == "int32" and value["shape"] == [2, 2]
    raw = base64.b64decode(value["b64"])
    assert raw == np.array([[1, 3], [2, 4]], dtype="<i4").tobytes()


# pack / unpack


def test_pack_then_unpack_gives_back_every_tensor() -> None:
    original: dict[str, np.ndarray] = {
        "image": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "ids": np.array([[1, -2], [3, 4]], dtype=np.int64),
        "mask": np.array([True, False]),
        "half": np.array([0.5, 1.5], dtype=np.float16),
    }
    unpacked = unpack(pack(original))
    assert list(unpacked) == list(original)
    for name, array in original.items():
        assert unpacked[name].dtype == array.dtype
        np.testing.assert_array_equal(unpacked[name], array)


def test_pack_then_unpack_keeps_empty_batches_and_scalars() -> None:
    original: dict[str, np.ndarray] = {
        "empty": np.zeros((0, 5), dtype=np.float32),
        "scalar": np.array(7, dtype=np.int32),
        "zero_wide": np.zeros((3, 0), dtype=np.uint8),
    }
    unpacked = unpack(pack(original))
    for name, array in original.items():
        assert unpacked[name].shape == array.shape
        assert unpacked[name].dtype == array.dtype
    assert int(unpacked["scalar"]) == 7
    assert unpack(pack({})) == {}


def test_pack_of_non_contiguous_and_big_endian_arrays() -> None:
    array = np.arange(12, dtype=">f8").reshape(3, 4)[:, ::2]
    unpacked = unpack(pack({"x": array}))["x"]
    np.testing.assert_array_equal(unpacked, array)


def test_unpack_gives_read_only_views() -> None:
    unpacked = unpack(pack({"x": np.ones(3, dtype=np.float32)}))["x"]
    assert not unpacked.flags.writeable


@pytest.mark.parametrize(
    "array",
    [np.array([object(), 1], dtype=object), np.array([b"a", 1], dtype=object), np.array([1j])],
)
def test_pack_refuses_dtypes_it_cannot_unpack(array: np.ndarray) -> None:
    with pytest.raises(TensorError, match="cannot pack 'x'"):
        pack({"x": array})


def test_unpack_rejects_a_blob_that_is_not_packed() -> None:
    with pytest.raises(TensorError, match="not a packed tensor blob"):
        unpack(b"{'x': [1, 2]}")


def test_batch_size_is_the_shared_leading_dimension() -> None:
    assert tensors.batch_size({"a": np.zeros((3, 2)), "b": np.zeros(3)}) == 3
    assert tensors.batch_size({}) == 0


# strings


def strings(*items: bytes) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


def test_decode_strings_gives_an_object_array_of_utf8_bytes() -> None:
    array = decode([["héllo", ""], ["日本", "a\u0000b"]], dtype="string")
    assert array.dtype == object and array.shape == (2, 2)
    assert array.tolist() == [["héllo".encode(), b""], ["日本".encode(), b"a\x00b"]]


def test_decode_strings_takes_b64_elements_for_binary_bytes() -> None:
    array = decode(["text", {"b64": base64.b64encode(b"\xff\x00").decode()}], dtype="string")
    assert array.tolist() == [b"text", b"\xff\x00"]


def test_decode_strings_keeps_the_shape_of_empty_lists() -> None:
    assert decode([], dtype="string").shape == (0,)
    assert decode([[], []], dtype="string").shape == (2, 0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "expected strings .* for dtype string, got a number"),
        (["a", True], "got true/false"),
        ([["a"], [None]], "got null"),
        ([{"b64": "a", "x": 1}], "got an object"),
        ([{"b64": "!!"}], "b64 is not valid base64"),
        ([["a", "b"], ["c"]], "ragged"),
        ([["a"], "b"], "ragged"),
        (["a", ["b"]], "ragged"),
        ("abc", "expected nested lists of strings"),
        ({"b64": "YQ==", "dtype": "string", "shape": [1]}, "expected nested lists of strings"),
        ([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["a"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], "deeper than 32"),
    ],
)
def test_decode_strings_refuses_what_is_not_strings(value: Any, message: str) -> None:
    with pytest.raises(TensorError, match=message):
        decode(value, dtype="string")


def test_encode_strings_as_text_or_b64_where_not_utf8() -> None:
    array = strings(b"caf\xc3\xa9", b"\xff").reshape(1, 2)
    assert encode(array) == [["café", {"b64": "/w=="}]]
    assert encode(array, encoding="b64") == [[{"b64": "Y2Fmw6k="}, {"b64": "/w=="}]]


@pytest.mark.parametrize("encoding", ["json", "b64"])
def test_encode_then_decode_strings_gives_back_the_bytes(encoding: str) -> None:
    original = strings(b"a", b"\xc3", b"", "é".encode()).reshape(2, 2)
    array = decode(encode(original, encoding=encoding), dtype="string")
    assert array.tolist() == original.tolist()


def test_encode_numpy_str_and_bytes_arrays_as_strings() -> None:
    assert encode(np.array([["a", "é"]])) == [["a", "é"]]
    assert encode(np.array([b"a", b"b"])) == ["a", "b"]


def test_pack_then_unpack_strings_among_other_tensors() -> None:
    original: dict[str, np.ndarray] = {
        "text": strings(b"one", b"", b"\xff\x00three", "é".encode()).reshape(2, 2),
        "x": np.arange(4, dtype=np.float32),
        "empty": strings(),
        "scalar": strings(b"s").reshape(()),
    }
    unpacked = unpack(pack(original))
    assert list(unpacked) == list(original)
    for name, array in original.items():
        assert unpacked[name].shape == array.shape
        assert unpacked[name].tolist() == array.tolist()
    assert unpacked["text"].dtype == object
    assert not unpacked["text"].flags.writeable


def test_pack_stores_str_and_fixed_width_arrays_as_utf8_bytes() -> None:
    unpacked = unpack(pack({"u": np.array(["é", "ab"]), "s": np.array([b"x", b"yz"])}))
    assert unpacked["u"].tolist() == ["é".encode(), b"ab"]
    assert unpacked["s"].tolist() == [b"x", b"yz"]


def test_unpack_reads_a_blob_packed_before_strings_existed() -> None:
    # The layout packed blobs had before string tensors: unchanged for every other dtype.
    head = b'[{"name":"x","dtype":"float32","shape":[2],"offset":0,"nbytes":8}]'
    blob = b"TFT1" + len(head).to_bytes(4, "little") + head + np.float32([1, 2]).tobytes()
    np.testing.assert_array_equal(unpack(blob)["x"], [1, 2])
    assert pack({"x": np.float32([1, 2])}) == blob


# Binary bodies: .npy and .npz


def npz_by_numpy(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


SAMPLE_ARRAY = np.arange(6, dtype=np.float64).reshape(2, 3)
BODY_ARRAYS: dict[str, np.ndarray] = {
    "image": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    "ids": np.array([[1, -(2**40)]], dtype=np.int64),
    "mask": np.array([True, False]),
    "half": np.array([0.5, 1.5], dtype=np.float16),
    "empty": np.zeros((0, 5), dtype=np.uint8),
    "scalar": np.array(7, dtype=np.int32),
    "é": np.ones(2, dtype=np.float64),
}


def test_write_npz_is_what_np_load_reads_with_every_array_aligned() -> None:
    body = tensors.write_npz(BODY_ARRAYS)
    assert zipfile.ZipFile(io.BytesIO(body)).testzip() is None  # every CRC-32 right
    with np.load(io.BytesIO(body)) as archive:
        assert archive.files == list(BODY_ARRAYS)
        for name, array in BODY_ARRAYS.items():
            assert archive[name].dtype == array.dtype and archive[name].shape == array.shape
            np.testing.assert_array_equal(archive[name], array)
    read = tensors.read_npz(body)
    for name, array in read.items():
        offset = array.ctypes.data - np.frombuffer(body, np.uint8).ctypes.data
        assert offset % 64 == 0, name
    assert tensors.read_npz(tensors.write_npz({})) == {}


def test_read_npz_gives_read_only_views_of_the_body_without_a_copy() -> None:
    body = npz_by_numpy(**BODY_ARRAYS)
    read = tensors.read_npz(body)
    assert list(read) == list(BODY_ARRAYS)
    view = np.frombuffer(body, np.uint8)
    for name, array in BODY_ARRAYS.items():
        assert read[name].dtype == array.dtype
        np.testing.assert_array_equal(read[name], array)
        assert not read[name].flags.writeable
        if array.size:
            assert np.shares_memory(read[name], view), name


def test_read_npz_reads_zip64_entries_and_fortran_order_big_endian_arrays() -> None:
    fortran = np.asfortranarray(np.arange(6, dtype=">f8").reshape(2, 3))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in {"f": fortran, "x": BODY_ARRAYS["image"]}.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array)
    read = tensors.read_npz(buffer.getvalue())
    np.testing.assert_array_equal(read["f"], fortran)
    np.testing.assert_array_equal(read["x"], BODY_ARRAYS["image"])
    assert read["f"].dtype == np.dtype(">f8")


def test_read_npz_reads_zip64_sizes_offsets_and_end_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a writer does past 4 GiB (sizes and offsets in zip64 extra fields, a zip64 end
    # record), here for small members: zipfile's limit lowered.
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 16)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in ("a", "b"):
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, SAMPLE_ARRAY + len(name))
    body = buffer.getvalue()
    assert b"PK\x06\x06" in body  # the zip64 end record

    read = tensors.read_npz(body)
    assert sorted(read) == ["a", "b"]
    np.testing.assert_array_equal(read["b"], SAMPLE_ARRAY + 1)


def test_write_npy_and_read_npy_are_np_save_and_np_load() -> None:
    for array in BODY_ARRAYS.values():
        body = tensors.write_npy(array)
        np.testing.assert_array_equal(np.load(io.BytesIO(body)), array)
        buffer = io.BytesIO()
        np.save(buffer, array)
        read = tensors.read_npy(buffer.getvalue())
        assert read.dtype == array.dtype and read.shape == array.shape
        np.testing.assert_array_equal(read, array)


def test_pack_copies_a_view_of_a_body_once_into_the_blob() -> None:
    body = tensors.write_npz({"x": BODY_ARRAYS["image"]})
    blob = pack(tensors.read_npz(body))
    assert blob == pack({"x": BODY_ARRAYS["image"]})
    np.testing.assert_array_equal(unpack(blob)["x"], BODY_ARRAYS["image"])


def test_npz_of_blob_holds_the_packed_arrays_and_refuses_strings() -> None:
    with np.load(io.BytesIO(tensors.npz_of_blob(pack(BODY_ARRAYS)))) as archive:
        for name, array in BODY_ARRAYS.items():
            np.testing.assert_array_equal(archive[name], array)
    with pytest.raises(TensorError, match=re.escape("cannot write 's' as .npy: dtype object")):
        tensors.npz_of_blob(pack({"s": strings(b"a")}))


def npy_with_header(header: str, data: bytes = b"") -> bytes:
    text = header.encode("latin-1")
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not an .npy array"),
        (b"\x93NUMPY\x04\x00\x00\x00", ".npy format 4.0 is not read"),
        (npy_with_header("{'descr': '<f4'"), "header is not one NumPy reads"),
        (npy_with_header("[1, 2]"), "Header is not a dictionary"),
        (npy_with_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}"), "fortran_order"),
        (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"), "shape"),
        (npy_with_header("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}", b"\0" * 8),
         "would need pickle"),
        (npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}"),
         "structured"),
        (npy_with_header("{'descr': 'f4,(2 3)', 'fortran_order': False, 'shape': (1,)}"),
         "header is not one NumPy reads"),
        (npy_with_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({2**70},)}}"),
         f"need {4 * 2**70}"),
        (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", b"\0" * 9),
         "holds 9 bytes of data but dtype float32 and shape [2] need 8"),
    ],
)  # fmt: skip
def test_read_npy_refuses_what_is_not_a_tensor(body: bytes, message: str) -> None:
    with pytest.raises(TensorError, match=re.escape(message)):
        tensors.read_npy(body)


def zip_with(name: str, data: bytes, *, compress: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compress) as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not an .npz archive (File is not a zip file)"),
        (b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 1, 1, 46, 0, 0),
         "Bad offset for central directory"),
        (zip_with("x.txt", b"hello"), "member 'x.txt' is not an .npy array"),
        (zip_with("x.npy", tensors.write_npy(np.ones(3)), compress=zipfile.ZIP_DEFLATED),
         "member 'x.npy' is compressed"),
        (zip_with("x.npy", b"junk"), "member 'x.npy': not an .npy array"),
        (tensors.write_npz({"x": np.ones(3)})[:-30], "File is not a zip file"),
    ],
)  # fmt: skip
def test_read_npz_refuses_what_is_not_an_npz(body: bytes, message: str) -> None:
    with pytest.raises(TensorError, match=re.escape(message)):
        tensors.read_npz(body)


def test_read_npz_refuses_a_member_twice_and_too_many_members() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive, pytest.warns(UserWarning, match="Duplicate"):
        archive.writestr("x.npy", tensors.write_npy(np.ones(1)))
        archive.writestr("x.npy", tensors.write_npy(np.ones(1)))
    with pytest.raises(TensorError, match=re.escape("member 'x.npy' appears twice")):
        tensors.read_npz(buffer.getvalue())
    many = {f"a{i}": np.ones(1) for i in range(tensors.MAX_NPZ_MEMBERS + 1)}
    with pytest.raises(TensorError, match=f"{tensors.MAX_NPZ_MEMBERS + 1} members"):
        tensors.read_npz(tensors.write_npz(many))


def test_read_npz_refuses_a_directory_too_long_before_zipfile_reads_it() -> None:
    # zipfile reads every entry the end record's directory size covers, whatever its count says:
    # here 1, for a directory of tiny entries that would take zipfile seconds at 64 MiB.
    entry = b"PK\x01\x02" + bytes(24) + struct.pack("<H", 1) + bytes(16) + b"a"
    directory = entry * (npy._NPZ_MAX_DIRECTORY // len(entry) + 1)
    end = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 1, 1, len(directory), 0, 0)
    with pytest.raises(TensorError, match=f"a zip directory of {len(directory)} bytes"):
        tensors.read_npz(directory + end)


def test_write_npz_writes_zip64_records_where_sizes_need_them_still_aligned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What past 4 GiB needs, here past 1,000 bytes: zipfile's limit lowered.
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 1000)
    arrays = {"big": np.arange(1000, dtype=np.float32), **BODY_ARRAYS}
    body = tensors.write_npz(arrays)
    monkeypatch.undo()
    assert b"PK\x06\x06" in body  # the zip64 end record
    with np.load(io.BytesIO(body)) as archive:
        for name, array in arrays.items():
            np.testing.assert_array_equal(archive[name], array)
    for name, array in tensors.read_npz(body).items():
        assert (array.ctypes.data - np.frombuffer(body, np.uint8).ctypes.data) % 64 == 0, name


def test_read_npz_and_read_npy_raise_only_tensor_error_on_mangled_bodies() -> None:
    rng = random.Random(7)
    sources = [
        tensors.write_npz(BODY_ARRAYS),
        npz_by_numpy(x=np.ones(3)),
        tensors.write_npy(SAMPLE_ARRAY),
    ]
    for _ in range(3000):
        source = rng.choice(sources)
        body = bytearray(source)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(body))
            if rng.random() < 0.7:
                body[at] = rng.randrange(256)
            else:
                del body[at : at + rng.randint(1, 40)]
        read = tensors.read_npy if source is sources[2] else tensors.read_npz
        with contextlib.suppress(TensorError):  # anything else fails the test
            read(bytes(body))


@pytest.mark.parametrize(
    ("array", "dtype", "message"),
    [
        (np.ones(2, np.float64), "float32", "expected dtype float32, got float64"),
        (np.ones(2, ">f4").astype("V4"), "float32", "expected dtype float32, got void32"),
        (np.frombuffer(b"\x00\x02", np.bool_), "bool", "bytes must each be 0 or 1"),
        (np.ones(2, np.float32), "string", "expected strings (NumPy dtype S or U"),
    ],
)
def test_from_array_checks_the_dtype_as_decode_does(
    array: np.ndarray, dtype: str, message: str
) -> None:
    with pytest.raises(TensorError, match=re.escape(message)):
        tensors.from_array(array, dtype=dtype)


def test_from_array_keeps_the_array_and_reads_strings_as_bytes() -> None:
    array = np.ones(3, dtype=">f4")
    assert tensors.from_array(array, dtype="float32") is array
    assert tensors.from_array(np.array(["é", "b"]), dtype="string").tolist() == ["é".encode(), b"b"]
    assert tensors.from_array(np.array([b"x"]), dtype="string").tolist() == [b"x"]
