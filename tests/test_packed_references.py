"""Packed blobs whose entries point into the object store (issue 26): a large tensor's bytes lie
in a whole .npy object, the blob holds only where."""

from __future__ import annotations

import numpy as np
import pytest

from tffleet import tensors
from tffleet.tensors import MissingObject, Reference, TensorError, pack, references, unpack


def npy_object(array: np.ndarray) -> tuple[bytes, Reference]:
    """An object as the store holds it (a whole .npy file) and a reference to its data."""
    data = tensors.write_npy(array)
    nbytes = array.nbytes
    return data, Reference(
        key="acme/uploads/ab.npy",
        dtype=array.dtype.name,
        shape=tuple(array.shape),
        offset=len(data) - nbytes,
        nbytes=nbytes,
    )


def test_a_reference_unpacks_as_a_view_of_its_object() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    data, ref = npy_object(array)
    blob = pack({"ids": np.array([1, 2], dtype=np.int64)}, {"image": ref})
    assert references(blob) == {"image": ref}
    view = memoryview(data)
    unpacked = unpack(blob, {ref.key: view})
    assert list(unpacked) == ["ids", "image"]
    np.testing.assert_array_equal(unpacked["image"], array)
    np.testing.assert_array_equal(unpacked["ids"], [1, 2])
    assert not unpacked["image"].flags.writeable
    # No copy: the array's memory is the object's.
    assert np.shares_memory(unpacked["image"], np.frombuffer(data, dtype=np.uint8))


def test_the_object_is_a_whole_npy_file_np_load_reads() -> None:
    array = np.array([[True, False]])
    data, ref = npy_object(array)
    np.testing.assert_array_equal(tensors.read_npy(data), array)
    np.testing.assert_array_equal(unpack(pack({}, {"m": ref}), {ref.key: data})["m"], array)


def test_a_reference_without_its_object_raises_missing_object() -> None:
    _, ref = npy_object(np.zeros(4, dtype=np.int32))
    blob = pack({}, {"x": ref})
    with pytest.raises(MissingObject) as caught:
        unpack(blob)
    assert caught.value.key == ref.key
    assert isinstance(caught.value, TensorError)
    with pytest.raises(MissingObject):
        unpack(blob, {"other/key.npy": b""})


def test_a_blob_without_references_has_none() -> None:
    blob = pack({"x": np.ones(3, dtype=np.float32)})
    assert references(blob) == {}
    np.testing.assert_array_equal(unpack(blob, {})["x"], np.ones(3))


def test_an_object_shorter_than_its_reference_is_refused() -> None:
    data, ref = npy_object(np.zeros(8, dtype=np.float64))
    with pytest.raises(TensorError, match="shorter"):
        unpack(pack({}, {"x": ref}), {ref.key: data[:-8]})


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [("string", (2,), 2), ("float32", (2, 2), 15), ("complex64", (1,), 8)],
)
def test_a_reference_must_fit_its_dtype_and_shape(
    dtype: str, shape: tuple[int, ...], nbytes: int
) -> None:
    with pytest.raises(TensorError):
        Reference(key="k", dtype=dtype, shape=shape, offset=128, nbytes=nbytes)


def test_a_name_cannot_be_both_inline_and_a_reference() -> None:
    _, ref = npy_object(np.zeros(2, dtype=np.uint8))
    with pytest.raises(TensorError, match="both"):
        pack({"x": np.zeros(2, dtype=np.uint8)}, {"x": ref})
