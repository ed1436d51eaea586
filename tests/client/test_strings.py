"""The Python client's string tensors: NumPy str, bytes and object arrays go out as nested lists
of strings; string outputs come back as object arrays of bytes."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from tffleet.client.errors import ProtocolError
from tffleet.client.job import Job, decode_tensor, encode_inputs


@pytest.mark.filterwarnings("ignore:tffleet. sending a float64 array")  # `n`: it warns once
def test_string_arrays_go_out_as_nested_lists_with_b64_for_bytes_that_are_not_text() -> None:
    binary = np.empty(2, dtype=object)
    binary[:] = [b"\xff", "é".encode()]

    sent = encode_inputs(
        {"u": np.array([["a", "é"]]), "s": np.array([b"x"]), "o": binary, "n": np.ones(1)}
    )

    assert sent["u"] == [["a", "é"]]
    assert sent["s"] == ["x"]
    assert sent["o"] == [{"b64": "/w=="}, "é"]
    assert sent["n"]["dtype"] == "float64"  # numbers stay binary envelopes
    assert encode_inputs(np.array(["bare"])) == ["bare"]


@pytest.mark.parametrize(
    "value", [[["a", {"b64": "/w=="}]], [[{"b64": "YQ=="}, {"b64": "/w=="}]]], ids=["json", "b64"]
)
def test_string_outputs_come_back_as_object_arrays_of_bytes(value: list[list[object]]) -> None:
    array = decode_tensor(value)

    assert array.dtype == object
    assert array.tolist() == [[b"a", b"\xff"]]


def test_number_and_empty_outputs_are_unchanged() -> None:
    assert decode_tensor([[1.5, 2]]).tolist() == [[1.5, 2.0]]
    assert decode_tensor([True, False]).dtype == np.bool_
    assert decode_tensor([]).shape == (0,)


def test_a_malformed_string_output_is_a_protocol_error() -> None:
    with pytest.raises(
        ProtocolError, match="output is not a valid tensor: nested lists are ragged"
    ):
        decode_tensor([["a"], "b"])


def test_a_jobs_dict_writes_string_outputs_as_json_strings() -> None:
    now = datetime.now(UTC)
    text = np.empty(2, dtype=object)
    text[:] = [b"ok", b"\xff"]
    job = Job("j", "m", 1, "succeeded", 0, 1, now, now, now, None, {"t": text})

    assert job.to_dict()["outputs"] == {"t": ["ok", {"b64": "/w=="}]}
