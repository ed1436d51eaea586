"""The Open Inference Protocol's metadata shapes: the server's extensions, a model's metadata
and Triton's model configuration, and the repository index.

Pure functions: the routes (api/protocols/oip/routes.py) read the registry and answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from api.protocols.oip.codec import DATATYPE_OF, read_header
from tffleet.errors import InvalidRequest

EXTENSIONS = ["binary_tensor_data", "model_configuration"]

# A model's format as the registry has it, and the platform name Triton gives such a model.
PLATFORMS = {
    "saved_model": "tensorflow_savedmodel",
    "frozen_graph": "tensorflow_graphdef",
    "keras": "tensorflow_keras",
}


def read_index_request(body: bytes) -> bool:
    """Whether a repository index request asks for the ready models only (`{"ready": true}`);
    an empty body asks for all."""
    if not body.strip():
        return False
    parsed = read_header(body, max_items=16)
    if not isinstance(parsed, dict) or not isinstance(parsed.get("ready", False), bool):
        raise InvalidRequest('body: expected {"ready": true or false}, or nothing')
    return bool(parsed.get("ready", False))


def index_entry(name: str, version: int, *, served: bool, retired: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "version": str(version)}
    if served:
        entry["state"] = "READY"
    else:
        entry["state"] = "UNAVAILABLE"
        entry["reason"] = "retired" if retired else "no live worker holds it"
    return entry


def tensor_metadata(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    shape = spec.get("shape")
    return {
        "name": name,
        "datatype": DATATYPE_OF.get(spec["dtype"], spec["dtype"].upper()),
        "shape": [] if shape is None else [-1 if d is None else int(d) for d in shape],
    }


def model_metadata(
    *,
    name: str,
    versions: Sequence[int],
    format: str,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "name": name,
        "versions": [str(v) for v in versions],
        "platform": PLATFORMS.get(format, format),
        "inputs": [tensor_metadata(k, spec) for k, spec in sorted(inputs.items())],
        "outputs": [tensor_metadata(k, spec) for k, spec in sorted(outputs.items())],
    }


def model_config(
    *,
    name: str,
    format: str,
    max_batch_size: int,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
) -> dict[str, Any]:
    """Triton's model configuration (its `model_configuration` extension), as far as tffleet
    has one: the batch dimension is implicit (`max_batch_size`), so `dims` leave it out."""

    def tensor(key: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        meta = tensor_metadata(key, spec)
        datatype = _CONFIG_TYPE.get(meta["datatype"], meta["datatype"])
        return {"name": key, "data_type": f"TYPE_{datatype}", "dims": meta["shape"][1:]}

    return {
        "name": name,
        "platform": PLATFORMS.get(format, format),
        "max_batch_size": max_batch_size,
        "input": [tensor(k, spec) for k, spec in sorted(inputs.items())],
        "output": [tensor(k, spec) for k, spec in sorted(outputs.items())],
    }


# Triton's config names a datatype as TYPE_<name>, BYTES as TYPE_STRING.
_CONFIG_TYPE = {"BYTES": "STRING"}
