"""Inputs checked against a signature: string and bool tensors, and messages naming the field."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from api.validation import validate_inputs
from tffleet import tensors
from tffleet.errors import InvalidInput

SIGNATURE = {
    "text": {"dtype": "string", "shape": [-1, 2]},
    "flag": {"dtype": "bool", "shape": [-1]},
    "x": {"dtype": "float32", "shape": [-1]},
}


def inputs(**changes: Any) -> dict[str, Any]:
    return {"text": [["a", "b"], ["c", "d"]], "flag": [True, False], "x": [0.5, 1], **changes}


def test_strings_bools_and_numbers_are_decoded_to_their_signature_dtypes() -> None:
    arrays, batch = validate_inputs(
        inputs(text=[["é", {"b64": "/w=="}], ["", "d"]]), signature=SIGNATURE, model="m"
    )

    assert batch == 2
    assert arrays["text"].dtype == object
    assert arrays["text"].tolist() == [["é".encode(), b"\xff"], [b"", b"d"]]
    assert arrays["flag"].dtype == np.bool_ and arrays["flag"].tolist() == [True, False]
    assert arrays["x"].dtype == np.float32


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"text": [[1, 2], [3, 4]]},
            'inputs.text: expected strings (or {"b64": ...} for bytes) for dtype string, '
            "got a number",
        ),
        ({"text": [["a", None], ["c", "d"]]}, "inputs.text: expected strings"),
        ({"text": [["a", "b", "c"], ["d", "e", "f"]]}, "inputs.text: dimension 1 must be 2"),
        ({"text": ["a", "b"]}, "inputs.text: expected rank 2"),
        ({"x": ["0.5", "1"]}, "inputs.x: expected numbers of dtype float32, got strings"),
        ({"x": [True, 2]}, "inputs.x: expected numbers of dtype float32, got true/false"),
        ({"flag": [1, 0]}, "inputs.flag: expected true/false for dtype bool"),
        ({"flag": ["true", "false"]}, "inputs.flag: expected true/false for dtype bool"),
        ({"flag": [True]}, "inputs.text: batch size 2 differs from the other inputs' 1"),
    ],
)
def test_a_wrong_type_is_refused_naming_the_input(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_inputs(inputs(**changes), signature=SIGNATURE, model="m")

    assert raised.value.message.startswith(message), raised.value.message


def test_a_single_string_input_takes_a_bare_tensor() -> None:
    arrays, batch = validate_inputs(
        [["hello"], ["world"]], signature={"s": {"dtype": "string", "shape": [-1, 1]}}, model="m"
    )

    assert batch == 2
    assert arrays["s"].tolist() == [[b"hello"], [b"world"]]


@pytest.mark.parametrize(
    "sent",
    [np.array([0.5, 1e30], np.float64), np.array([3, -7], np.int16), np.array([2], np.float16)],
    ids=["float64", "int16", "float16"],
)
def test_numbers_a_float_input_holds_are_cast_to_it(sent: np.ndarray) -> None:
    envelope = tensors.encode(sent, encoding="b64")
    for value in (sent, envelope):  # a binary body's array, a JSON body's envelope
        arrays, _ = validate_inputs(
            inputs(x=value, flag=[True] * len(sent), text=[["a", "b"]] * len(sent)),
            signature=SIGNATURE,
            model="m",
        )
        assert arrays["x"].dtype == np.float32
        assert arrays["x"].tolist() == sent.astype(np.float32).tolist()


@pytest.mark.parametrize(
    ("sent", "message"),
    [
        (np.array([1e39, 0.5]), "inputs.x: float64 value out of range for dtype float32"),
        (np.array([np.nan, 0.5]), "inputs.x: contains NaN or infinity"),
        (np.array([1, 2], np.int32), "inputs.x: expected dtype float32, got"),
        (np.array([1, 2], np.int64), "inputs.x: expected dtype float32, got"),
        (np.array([True, False]), "inputs.x: expected dtype float32, got"),
    ],
    ids=["overflow", "nan", "int32", "int64", "bool"],
)
def test_numbers_a_float_input_cannot_hold_are_refused(sent: np.ndarray, message: str) -> None:
    for value in (sent, tensors.encode(sent, encoding="b64")):
        with pytest.raises(InvalidInput) as raised:
            validate_inputs(inputs(x=value), signature=SIGNATURE, model="m")
        assert raised.value.message.startswith(message), raised.value.message


def test_an_integer_input_takes_no_cast() -> None:
    signature = {"n": {"dtype": "int32", "shape": [-1]}}
    with pytest.raises(InvalidInput, match="expected dtype int32, got int16"):
        validate_inputs({"n": np.array([1], np.int16)}, signature=signature, model="m")
