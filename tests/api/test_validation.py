"""Inputs checked against a signature: string and bool tensors, and messages naming the field."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from api.validation import validate_inputs
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
