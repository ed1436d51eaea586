"""Columns checked against a model's signature before anything is stored (messages naming the
column and the input), and a batch's columns made into inputs, bad records set aside."""

from __future__ import annotations

import numpy as np

from tffleet.datasets.base import Batch, Column
from tffleet.datasets.mapping import check, inputs, resolve_columns

CNN = {"image": {"dtype": "float32", "shape": [-1, 4, 4, 3]}}
SCHEMA = {
    "pixels": Column("float32", (48,)),
    "id": Column("int64"),
    "name": Column("string"),
    "ragged": Column("float64", (-1,)),
}


def test_a_fitting_mapping_has_no_errors() -> None:
    assert check(SCHEMA, CNN, {"image": "pixels"}, key="id") == []
    assert check(SCHEMA, CNN, {"image": "ragged"}) == []  # each record checked as it is read
    # One column, one input: no mapping needed.
    assert check({"array": Column("uint8", (4, 4, 3))}, CNN) == []
    assert resolve_columns({"array": Column("uint8")}, CNN, None) == {"image": "array"}
    mlp = {"x": {"dtype": "float32", "shape": [-1]}}
    assert check(SCHEMA, mlp, {"x": "id"}) == []  # int64 to float32: same kind, cast


def test_messages_name_the_column_and_the_input() -> None:
    assert check(SCHEMA, CNN) == [
        "columns.image: column 'image' is not in the file "
        "(it has ['id', 'name', 'pixels', 'ragged'])"
    ]
    assert check(SCHEMA, CNN, {"image": "name"}) == [
        "columns.image: column 'name' is string; input 'image' takes float32",
        "columns.image: column 'name' has records of shape []; input 'image' takes [4, 4, 3] "
        "per record",
    ]
    ints = {"n": {"dtype": "int32", "shape": [-1, 48]}}
    assert check(SCHEMA, ints, {"n": "pixels"}) == [
        "columns.n: column 'pixels' is float32; input 'n' takes int32"
    ]
    wrong = {"image": {"dtype": "float32", "shape": [-1, 5, 5, 3]}}
    assert check(SCHEMA, wrong, {"image": "pixels"}) == [
        "columns.image: column 'pixels' has records of shape [48]; input 'image' takes [5, 5, 3] "
        "per record"
    ]
    assert check(SCHEMA, CNN, {"image": "pixels", "label": "id"}, key="nope") == [
        "columns.label: the model has no input 'label' (it takes ['image'])",
        "key: column 'nope' is not in the file (it has ['id', 'name', 'pixels', 'ragged'])",
    ]


def test_inputs_reshape_cast_and_set_bad_records_aside() -> None:
    pixels = np.arange(4 * 48, dtype=np.float32).reshape(4, 48)
    pixels[2, 5] = np.nan
    batch = Batch(columns={"pixels": pixels}, index=np.array([10, 11, 12, 13]))
    arrays, rows, errors = inputs(batch, CNN, {"image": "pixels"})
    assert arrays["image"].shape == (3, 4, 4, 3) and list(rows) == [0, 1, 3]
    assert errors == [(12, "column 'pixels': NaN or infinity")]
    ragged = np.empty(3, dtype=object)
    ragged[:] = [np.arange(48.0), np.arange(47.0), np.arange(48.0)]
    batch = Batch(columns={"ragged": ragged}, index=np.array([0, 1, 2]))
    arrays, rows, errors = inputs(batch, CNN, {"image": "ragged"})
    assert arrays["image"].dtype == np.float32 and arrays["image"].shape == (2, 4, 4, 3)
    assert list(rows) == [0, 2] and errors == [
        (1, "column 'ragged': 47 values, input takes [4, 4, 3]")
    ]
