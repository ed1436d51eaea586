"""Inputs checked against a model's registered signature, with messages that name the input."""

from __future__ import annotations

from typing import Any

import numpy as np

from tffleet import tensors
from tffleet.errors import InvalidInput, InvalidRequest

_ENVELOPE_KEYS = {"b64", "dtype", "shape"}


def validate_inputs(
    raw: dict[str, Any] | list[Any] | np.ndarray, *, signature: dict[str, Any], model: str
) -> tuple[dict[str, np.ndarray], int]:
    """Decode and check every input; returns the arrays and the batch size they share.

    `raw` is what a JSON body gave (wire tensors by name, or one bare tensor), or what a binary
    body gave (`read_binary`): arrays by name, or one bare array.
    """
    names = sorted(signature)
    if isinstance(raw, list | np.ndarray) or (
        isinstance(raw, dict) and set(raw) == _ENVELOPE_KEYS and not _ENVELOPE_KEYS & set(names)
    ):
        if len(names) != 1:
            raise InvalidInput(
                f"inputs: model {model!r} has {len(names)} inputs {names}; "
                "give them by name as an object"
            )
        raw = {names[0]: raw}
    missing = [n for n in names if n not in raw]
    if missing:
        raise InvalidInput(f"inputs: missing {missing}; model {model!r} takes {names}")
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise InvalidInput(f"inputs: unknown {unknown}; model {model!r} takes {names}")

    arrays: dict[str, np.ndarray] = {}
    batch: int | None = None
    for name in names:
        spec = signature[name]
        where = f"inputs.{name}"
        value = raw[name]
        try:
            if isinstance(value, np.ndarray):
                array = tensors.from_array(value, dtype=spec["dtype"])
            else:
                array = tensors.decode(value, dtype=spec["dtype"])
        except tensors.TensorError as exc:
            raise InvalidInput(f"{where}: {exc}") from None
        # Before the shape: `[]` is an empty batch, not a tensor of the wrong rank.
        if array.ndim == 0:
            raise InvalidInput(f"{where}: expected a batch (rank at least 1), got a scalar")
        if array.shape[0] == 0:
            raise InvalidInput(f"{where}: the batch is empty (shape {list(array.shape)})")
        expected = spec.get("shape")
        if expected is not None:
            if array.ndim != len(expected):
                raise InvalidInput(
                    f"{where}: expected rank {len(expected)} (shape {_shape(expected)}, "
                    f"batch first), got rank {array.ndim} (shape {list(array.shape)})"
                )
            for axis, (want, got) in enumerate(zip(expected[1:], array.shape[1:], strict=True)):
                if want != -1 and want != got:
                    raise InvalidInput(
                        f"{where}: dimension {axis + 1} must be {want} "
                        f"(shape {_shape(expected)}), got shape {list(array.shape)}"
                    )
        if batch is not None and array.shape[0] != batch:
            raise InvalidInput(
                f"{where}: batch size {array.shape[0]} differs from the other inputs' {batch}"
            )
        batch = int(array.shape[0])
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise InvalidInput(f"{where}: contains NaN or infinity")
        arrays[name] = array
    assert batch is not None
    return arrays, batch


def read_binary(body: bytes, media_type: str) -> dict[str, np.ndarray] | np.ndarray:
    """The inputs of an `application/x-npz` body (arrays by name) or an `application/x-npy`
    one (one bare array): read-only views of `body`, nothing copied. 400 naming the member at
    fault if the body is not one."""
    if not body:
        raise InvalidRequest(f"body: empty; expected an {_SUFFIX[media_type]} file")
    try:
        if media_type == tensors.NPY:
            return tensors.read_npy(body)
        return tensors.read_npz(body)
    except tensors.TensorError as exc:
        raise InvalidRequest(f"body: {exc}") from None


_SUFFIX = {tensors.NPY: ".npy", tensors.NPZ: ".npz"}


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join("None" if d == -1 else str(d) for d in shape) + "]"
