"""TF Serving's REST shapes (tensorflow.org/tfx/serving/api_rest): a predict body read into a
job's inputs, a job's outputs written as `predictions` or `outputs`, and a model's status and
metadata as `GetModelStatusResponse` and `GetModelMetadataResponse` are written in JSON.

The columnar format (`inputs`) may give a tensor by reference to an upload, as the job API
takes one: `{"inputs": {"x": {"uri": "tffleet://uploads/<id>"}}}` (or `{"inputs": {"uri":
...}}` for a one-input model). The row format has no room for one: each instance holds a slice.

Pure functions: the routes (api/protocols/tfserving/routes.py) do the waiting and the answering.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tffleet import tensors
from tffleet.errors import InvalidRequest

Format = Literal["row", "columnar"]

# A SavedModel's default signature. A tffleet model serves one signature: this one, or the one
# its model.toml names (`signature`), which a request may name either way.
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"

# TensorFlow's DataType names, as GetModelMetadata writes them.
_DT = {
    "float16": "DT_HALF",
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "uint16": "DT_UINT16",
    "uint32": "DT_UINT32",
    "uint64": "DT_UINT64",
    "bool": "DT_BOOL",
    "string": "DT_STRING",
}


@dataclass(frozen=True)
class PredictRequest:
    format: Format
    inputs: dict[str, Any] | list[Any]  # as a job's `inputs` takes them (api/validation.py)


def _is_value(item: Any) -> bool:
    """A `{"b64": ...}` string element, or tffleet's binary envelope: a value, not inputs by
    name."""
    return isinstance(item, Mapping) and set(item) in ({"b64"}, {"b64", "dtype", "shape"})


def read_predict(body: Any, *, input_names: list[str], signature: str) -> PredictRequest:
    """A predict body's inputs as a job takes them; 400 naming the field at fault."""
    if not isinstance(body, dict):
        raise InvalidRequest("body: expected a JSON object with `instances` or `inputs`")
    unknown = sorted(set(body) - {"signature_name", "instances", "inputs"})
    if unknown:
        raise InvalidRequest(f"body: unknown keys {unknown}")
    name = body.get("signature_name")
    if name not in (None, "", DEFAULT_SIGNATURE, signature):
        raise InvalidRequest(
            f"signature_name: {name!r} is not served; this model serves {DEFAULT_SIGNATURE!r}"
        )
    if ("instances" in body) == ("inputs" in body):
        raise InvalidRequest("body: give either `instances` (row format) or `inputs` (columnar)")
    if "inputs" in body:
        return PredictRequest("columnar", _columnar(body["inputs"], input_names))
    return PredictRequest("row", _rows(body["instances"], input_names))


def _is_reference(value: Any) -> bool:
    """`{"uri": "tffleet://uploads/<id>"}`: an upload in place of a tensor (api/references.py
    checks it as the job API does)."""
    return isinstance(value, Mapping) and "uri" in value


def _columnar(value: Any, names: list[str]) -> dict[str, Any] | list[Any]:
    if _is_reference(value) and len(names) == 1 and "uri" not in names:
        # One tensor of a one-input model, given by reference.
        return {names[0]: value}
    if isinstance(value, dict | list):
        # By name, or one tensor (an envelope, or nested lists) of a one-input model.
        return value
    raise InvalidRequest("inputs: expected an object of tensors by input name, or one tensor")


def _rows(instances: Any, names: list[str]) -> dict[str, Any]:
    if not isinstance(instances, list) or not instances:
        raise InvalidRequest("instances: expected a non-empty list, one item per instance")
    named = [isinstance(item, dict) and not _is_value(item) for item in instances]
    if not any(named):
        if len(names) != 1:
            raise InvalidRequest(
                f"instances: the model has {len(names)} inputs {names}; give each instance as "
                "an object of its inputs by name"
            )
        return {names[0]: instances}
    if not all(named):
        raise InvalidRequest(
            "instances: either every instance is an object of inputs by name, or none is"
        )
    keys = set(instances[0])
    for index, item in enumerate(instances):
        if set(item) != keys:
            raise InvalidRequest(
                f"instances[{index}]: has inputs {sorted(item)}, instances[0] has {sorted(keys)}"
            )
    return {key: [item[key] for item in instances] for key in sorted(keys)}


def _wire(name: str, array: np.ndarray) -> Any:
    # TF Serving writes a string output whose name ends in `_bytes` as {"b64": ...} throughout.
    binary = name.endswith("_bytes") and tensors.is_string(array)
    return tensors.encode(array, encoding="b64" if binary else "json")


def predict_answer(outputs: Mapping[str, np.ndarray], format: Format) -> dict[str, Any]:
    """`{"predictions": ...}` (row) or `{"outputs": ...}` (columnar), as TF Serving writes them:
    one output by itself, several by name (row: one object per instance)."""
    names = sorted(outputs)
    wire = {name: _wire(name, outputs[name]) for name in names}
    if format == "columnar":
        return {"outputs": wire[names[0]] if len(names) == 1 else wire}
    if len(names) == 1:
        return {"predictions": wire[names[0]]}
    sizes = {outputs[name].shape[0] if outputs[name].ndim else None for name in names}
    if len(sizes) != 1 or None in sizes:
        raise InvalidRequest(
            f"outputs {names} do not share a batch size {sorted(map(str, sizes))}: the row format "
            "cannot write them; send the columnar format (`inputs`)"
        )
    (size,) = sizes
    return {"predictions": [{name: wire[name][i] for name in names} for i in range(size or 0)]}


def version_status(version: int, state: str) -> dict[str, Any]:
    return {
        "version": str(version),
        "state": state,
        "status": {"error_code": "OK", "error_message": ""},
    }


def _tensor_info(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    shape = spec.get("shape")
    tensor_shape: dict[str, Any] = (
        {"dim": [], "unknown_rank": True}
        if shape is None
        else {"dim": [{"size": str(d), "name": ""} for d in shape], "unknown_rank": False}
    )
    return {
        "dtype": _DT.get(spec["dtype"], "DT_INVALID"),
        "tensor_shape": tensor_shape,
        "name": name,
    }


def metadata(
    *,
    name: str,
    version: int,
    signature: str,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
) -> dict[str, Any]:
    """GetModelMetadataResponse with the one signature the fleet serves, from the registry."""
    signature_def = {
        "inputs": {key: _tensor_info(key, spec) for key, spec in sorted(inputs.items())},
        "outputs": {key: _tensor_info(key, spec) for key, spec in sorted(outputs.items())},
        "method_name": PREDICT_METHOD,
    }
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": {"signature_def": {signature: signature_def}}},
    }
