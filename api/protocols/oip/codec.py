"""The Open Inference Protocol's infer shapes (KServe's "v2", Triton's HTTP API): an infer
request (JSON tensors, or the binary tensor data extension) read into a job's arrays, and a
job's outputs written as an infer response. The binary data's bytes are `binary.py`'s, server
and model metadata `metadata.py`'s (beside this file).

Pure functions: the routes (api/protocols/oip/routes.py) do the waiting and the answering.

    request body   JSON header [+ binary tensor data]; the header's length in
                   `Inference-Header-Content-Length` when binary data follows
    an input       {"name", "shape", "datatype", "data"} or, binary,
                   {"name", "shape", "datatype", "parameters": {"binary_data_size": n}}
    binary data    little-endian, row-major; BOOL one byte; BYTES each element a 4-byte
                   little-endian length and its bytes; inputs' data one after another
    by reference   {"name", "shape", "datatype", "parameters": {"tffleet_uri":
                   "tffleet://uploads/<id>"}}: an upload (POST /v1/uploads) in place of
                   the data; the facade checks it as the job API checks a {"uri": ...}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from api.protocols.oip.binary import from_binary, numpy_dtype, to_binary
from tffleet import tensors
from tffleet.errors import InvalidInput, InvalidRequest, PayloadTooLarge

HEADER_LENGTH = "Inference-Header-Content-Length"

# The protocol's datatypes and the signature dtypes they are. BF16 has no NumPy dtype here.
DATATYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": tensors.STRING,
}
DATATYPE_OF = {dtype: datatype for datatype, dtype in DATATYPES.items()}

_MAX_RANK = 32
_INPUT_KEYS = {"name", "shape", "datatype", "parameters", "data"}
_REQUEST_KEYS = {"id", "parameters", "inputs", "outputs"}
# Parameters of extensions tffleet does not serve: a request that needs one is refused, not
# answered as if it had not asked.
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
# An input's parameter naming an upload in place of its data (tffleet's own).
URI_PARAMETER = "tffleet_uri"


@dataclass(frozen=True)
class Output:
    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    # Arrays by name, or `{"uri": ...}` for an input given by reference (`tffleet_uri`).
    inputs: dict[str, np.ndarray | dict[str, str]]
    outputs: list[Output]  # what the answer holds, in this order
    timeout_s: float | None  # the `timeout` parameter (microseconds), as seconds
    shapes: dict[str, list[int]] = field(default_factory=dict)  # those by reference, as given


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary data after it (empty without the header's length)."""
    if header_length is None:
        return body, memoryview(b"")
    text = header_length.strip()
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= len(body):
        raise InvalidRequest(
            f"{HEADER_LENGTH}: expected the JSON header's length in bytes, at most the body's "
            f"{len(body)}, got {header_length!r}"
        )
    size = int(text)
    return body[:size], memoryview(body)[size:]


def read_header(header: bytes, *, max_items: int) -> Any:
    """The JSON header, parsed; 413 past `max_items` (counted by commas, as api/body.py does)."""
    if header.count(b",") > max_items:
        raise PayloadTooLarge(
            f"body holds over {max_items} JSON items (TFFLEET_MAX_JSON_ITEMS); send large "
            "tensors as binary data (tritonclient does by default)"
        )
    try:
        return orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None


def read_infer(
    body: Any,
    binary: memoryview,
    *,
    model: str,
    inputs: Mapping[str, Mapping[str, Any]],
    outputs: Mapping[str, Mapping[str, Any]],
) -> InferRequest:
    """An infer request's tensors as arrays by name, checked against the model's signature
    (`inputs` and `outputs`, as registered); 400 naming the field at fault."""
    if not isinstance(body, dict):
        raise InvalidRequest("body: expected a JSON object with `inputs`")
    unknown = sorted(set(body) - _REQUEST_KEYS)
    if unknown:
        raise InvalidRequest(f"body: unknown keys {unknown}; expected {sorted(_REQUEST_KEYS)}")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"id: expected a string, got {_json_type(request_id)}")
    parameters = _parameters(body.get("parameters"), "parameters")
    for name in ("sequence_id", "sequence_start", "sequence_end"):
        if parameters.get(name) not in (None, 0, "", False):
            raise InvalidRequest(
                f"parameters.{name}: sequences (stateful models) are not served; every "
                "request here is a job of its own"
            )
    timeout_s = _timeout(parameters.get("timeout"))
    binary_default = _flag(parameters, "binary_data_output", "parameters")

    given = body.get("inputs")
    if not isinstance(given, list) or not given:
        raise InvalidRequest("inputs: expected a non-empty list of input tensors")
    arrays: dict[str, np.ndarray | dict[str, str]] = {}
    shapes: dict[str, list[int]] = {}
    offset = 0
    for index, item in enumerate(given):
        name, array, used = _input(item, f"inputs[{index}]", binary[offset:], model, inputs)
        if name in arrays:
            raise InvalidRequest(f"inputs[{index}].name: input {name!r} is given twice")
        arrays[name] = array
        if isinstance(array, dict):
            shapes[name] = item["shape"]
        offset += used
    if offset != len(binary):
        raise InvalidRequest(
            f"body: {len(binary)} bytes of binary data follow the JSON header, but the inputs' "
            f"binary_data_size add up to {offset}"
        )
    return InferRequest(
        id=request_id,
        inputs=arrays,
        outputs=_requested(body.get("outputs"), binary_default, model, outputs),
        timeout_s=timeout_s,
        shapes=shapes,
    )


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}: expected an object, got {_json_type(value)}")
    for name in _SHARED_MEMORY:
        if name in value:
            raise InvalidRequest(
                f"{where}.{name}: the shared-memory extension is not served (the fleet's "
                "workers are on other hosts); send the tensor's data in the body"
            )
    return value


def _flag(parameters: Mapping[str, Any], name: str, where: str) -> bool:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where}.{name}: expected true or false, got {_json_type(value)}")
    return value


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidRequest(
            f"parameters.timeout: expected a positive integer of microseconds, got {value!r}"
        )
    return value / 1e6


def _input(
    item: Any,
    where: str,
    binary: memoryview,
    model: str,
    signature: Mapping[str, Mapping[str, Any]],
) -> tuple[str, np.ndarray | dict[str, str], int]:
    """One input: its name, its array (shaped as given) or the reference to its upload, and
    how many binary bytes it used."""
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where}: expected an object, got {_json_type(item)}")
    unknown = sorted(set(item) - _INPUT_KEYS)
    if unknown:
        raise InvalidRequest(f"{where}: unknown keys {unknown}")
    name = item.get("name")
    if not isinstance(name, str):
        raise InvalidRequest(f"{where}.name: expected a string")
    if name not in signature:
        raise InvalidInput(
            f"{where}.name: model {model!r} has no input {name!r}; it takes {sorted(signature)}"
        )
    dtype = signature[name]["dtype"]
    datatype = item.get("datatype")
    if datatype not in DATATYPES:
        raise InvalidRequest(
            f"{where}.datatype: expected one of {sorted(DATATYPES)}, got {datatype!r}"
        )
    if DATATYPES[datatype] != dtype:
        raise InvalidInput(
            f"{where}.datatype: input {name!r} is {DATATYPE_OF.get(dtype, dtype)}, got {datatype}"
        )
    shape = _shape(item.get("shape"), f"{where}.shape")
    count = math.prod(shape)
    parameters = _parameters(item.get("parameters"), f"{where}.parameters")
    size = parameters.get("binary_data_size")
    if URI_PARAMETER in parameters:
        return name, _reference(item, parameters, size, where), 0
    if size is None:
        if "data" not in item:
            raise InvalidRequest(f"{where}: give `data`, or binary data (binary_data_size)")
        array = _from_json(item["data"], dtype, count, f"{where}.data")
        used = 0
    else:
        if "data" in item:
            raise InvalidRequest(f"{where}: give either `data` or binary data, not both")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidRequest(f"{where}.parameters.binary_data_size: expected bytes, >= 0")
        if size > len(binary):
            raise InvalidRequest(
                f"{where}.parameters.binary_data_size: {size} bytes, but only {len(binary)} "
                "bytes of binary data are left in the body"
            )
        array = from_binary(binary[:size], dtype, count, f"{where}")
        used = size
    return name, array.reshape(shape), used


def _reference(
    item: Mapping[str, Any], parameters: Mapping[str, Any], size: Any, where: str
) -> dict[str, str]:
    """`parameters.tffleet_uri` as the job API's reference; the URI itself is checked with the
    upload it names (api/references.py), its shape against the one given (api/protocols)."""
    uri = parameters[URI_PARAMETER]
    if not isinstance(uri, str):
        raise InvalidRequest(f"{where}.parameters.{URI_PARAMETER}: expected a string")
    if "data" in item or size is not None:
        raise InvalidRequest(
            f"{where}: give either `data`, binary data or parameters.{URI_PARAMETER}, not both"
        )
    return {"uri": uri}


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or len(value) > _MAX_RANK:
        raise InvalidRequest(f"{where}: expected a list of at most {_MAX_RANK} sizes")
    for size in value:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidRequest(f"{where}: expected sizes >= 0, got {value}")
    return value


def _from_json(data: Any, dtype: str, count: int, where: str) -> np.ndarray:
    """`data` (flat, or nested: the shape decides) as a flat array of `count` elements."""
    if not isinstance(data, list):
        data = [data]
    try:
        array = tensors.decode(data, dtype=dtype) if data else np.empty(0, numpy_dtype(dtype))
    except tensors.TensorError as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    if array.size != count:
        raise InvalidInput(f"{where}: {array.size} elements, the shape holds {count}")
    return array.reshape(-1)


def _requested(
    value: Any, binary_default: bool, model: str, signature: Mapping[str, Any]
) -> list[Output]:
    if value is None:
        return [Output(name, binary_default) for name in sorted(signature)]
    if not isinstance(value, list):
        raise InvalidRequest(f"outputs: expected a list, got {_json_type(value)}")
    requested: dict[str, Output] = {}
    for index, item in enumerate(value):
        where = f"outputs[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidRequest(f"{where}: expected an object with a `name`")
        unknown = sorted(set(item) - {"name", "parameters"})
        if unknown:
            raise InvalidRequest(f"{where}: unknown keys {unknown}")
        name = item["name"]
        if name not in signature:
            raise InvalidInput(
                f"{where}.name: model {model!r} has no output {name!r}; it gives "
                f"{sorted(signature)}"
            )
        if name in requested:
            raise InvalidRequest(f"{where}.name: output {name!r} is asked for twice")
        parameters = _parameters(item.get("parameters"), f"{where}.parameters")
        if parameters.get("classification") not in (None, 0):
            raise InvalidRequest(
                f"{where}.parameters.classification: the classification extension is not "
                "served; ask for the output itself"
            )
        binary = parameters.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise InvalidRequest(f"{where}.parameters.binary_data: expected true or false")
        requested[name] = Output(name, binary)
    return list(requested.values())


def infer_answer(
    *,
    model: str,
    version: int,
    request: InferRequest,
    outputs: Mapping[str, np.ndarray],
    job_id: str,
) -> tuple[bytes, list[bytes]]:
    """An infer response: its JSON header, and the binary data of the outputs asked for as
    binary, in order (none: the header is the whole body)."""
    written: list[dict[str, Any]] = []
    data: list[bytes] = []
    for wanted in request.outputs:
        array = outputs[wanted.name]
        dtype = tensors.STRING if tensors.is_string(array) else array.dtype.name
        tensor: dict[str, Any] = {
            "name": wanted.name,
            "datatype": DATATYPE_OF[dtype],
            "shape": list(array.shape),
        }
        if wanted.binary:
            raw = to_binary(array)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            data.append(raw)
        else:
            tensor["data"] = _json_data(array, wanted.name)
        written.append(tensor)
    answer: dict[str, Any] = {"model_name": model, "model_version": str(version)}
    if request.id is not None:
        answer["id"] = request.id
    answer["parameters"] = {"tffleet_job_id": job_id}
    answer["outputs"] = written
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY), data


def _json_data(array: np.ndarray, name: str) -> Any:
    flat = array.reshape(-1)
    if not tensors.is_string(array):
        return flat  # orjson writes it (OPT_SERIALIZE_NUMPY)
    try:
        return [item.decode("utf-8") for item in tensors.as_bytes(flat)]
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"outputs: {name!r} holds bytes that are not UTF-8, which JSON cannot carry; ask "
            'for it as binary data ("binary_data": true)'
        ) from None


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )
