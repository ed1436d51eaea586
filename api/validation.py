"""Inputs checked against a model's registered signature, with messages that name the input."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from tffleet import tensors
from tffleet.errors import InvalidInput, InvalidRequest

log = logging.getLogger(__name__)

_ENVELOPE_KEYS = {"b64", "dtype", "shape"}
# Whether this process has logged a cast (`_cast`): once, not once a job.
_cast_logged = False


def validate_inputs(
    raw: dict[str, Any] | list[Any] | np.ndarray,
    *,
    signature: dict[str, Any],
    model: str,
    references: Mapping[str, tensors.Reference] | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """Decode and check every input; returns the arrays and the batch size they share.

    `raw` is what a JSON body gave (wire tensors by name, or one bare tensor), or what a binary
    body gave (`read_binary`): arrays by name, or one bare array. `references`: inputs held in
    the store (uploads), by name, checked by their dtype and shape alone (their values are not
    read: a NaN in one reaches the model) and not among the arrays returned.
    """
    references = references or {}
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
    missing = [n for n in names if n not in raw and n not in references]
    if missing:
        raise InvalidInput(f"inputs: missing {missing}; model {model!r} takes {names}")
    unknown = sorted((set(raw) | set(references)) - set(names))
    if unknown:
        raise InvalidInput(f"inputs: unknown {unknown}; model {model!r} takes {names}")

    arrays: dict[str, np.ndarray] = {}
    batch: int | None = None
    for name in names:
        spec = signature[name]
        where = f"inputs.{name}"
        if name in references:
            ref = references[name]
            if ref.dtype != spec["dtype"]:
                raise InvalidInput(f"{where}: expected dtype {spec['dtype']}, got {ref.dtype}")
            batch = _check_shape(where, ref.shape, spec.get("shape"), batch)
            continue
        try:
            array = _cast(_decoded(raw[name], spec["dtype"]), spec["dtype"], model=model, name=name)
        except tensors.TensorError as exc:
            raise InvalidInput(f"{where}: {exc}") from None
        batch = _check_shape(where, array.shape, spec.get("shape"), batch)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise InvalidInput(f"{where}: contains NaN or infinity")
        arrays[name] = array
    assert batch is not None
    return arrays, batch


def _check_shape(
    where: str, shape: tuple[int, ...], expected: list[int] | None, batch: int | None
) -> int:
    """`shape` against the signature's; returns its batch size, which must be `batch` (the
    other inputs') where that is known."""
    # Before the shape: `[]` is an empty batch, not a tensor of the wrong rank.
    if len(shape) == 0:
        raise InvalidInput(f"{where}: expected a batch (rank at least 1), got a scalar")
    if shape[0] == 0:
        raise InvalidInput(f"{where}: the batch is empty (shape {list(shape)})")
    if expected is not None:
        if len(shape) != len(expected):
            raise InvalidInput(
                f"{where}: expected rank {len(expected)} (shape {_shape(expected)}, "
                f"batch first), got rank {len(shape)} (shape {list(shape)})"
            )
        for axis, (want, got) in enumerate(zip(expected[1:], shape[1:], strict=True)):
            if want != -1 and want != got:
                raise InvalidInput(
                    f"{where}: dimension {axis + 1} must be {want} "
                    f"(shape {_shape(expected)}), got shape {list(shape)}"
                )
    if batch is not None and shape[0] != batch:
        raise InvalidInput(f"{where}: batch size {shape[0]} differs from the other inputs' {batch}")
    return int(shape[0])


def _decoded(value: Any, dtype: str) -> np.ndarray:
    """`value` as an array of the dtype it was sent in where `_cast` may take that one to
    `dtype`, else of `dtype` (the tensor functions refuse any other)."""
    sent = tensors.dtype_name(value.dtype) if isinstance(value, np.ndarray) else None
    if isinstance(value, dict) and isinstance(value.get("dtype"), str):
        sent = value["dtype"]
    if sent is not None and sent != dtype and _castable(sent, dtype):
        dtype = sent
    if isinstance(value, np.ndarray):
        return tensors.from_array(value, dtype=dtype)
    return tensors.decode(value, dtype=dtype)


def _castable(sent: str, dtype: str) -> bool:
    """Into a float input: float64 (NumPy's default, `np.random.rand`'s) where its values fit,
    and any dtype whose every value a float input holds exactly (int8, uint16, float16 into
    float32). Wider integers are refused: int32 into float32 would change values silently."""
    if sent not in tensors.DTYPES or dtype not in tensors.DTYPES:
        return False
    wanted = tensors.DTYPES[dtype]
    # Bools are not numbers here, as they are not in nested lists (nor in TensorFlow).
    if wanted.kind != "f" or tensors.DTYPES[sent].kind == "b":
        return False
    return sent == "float64" or bool(np.can_cast(tensors.DTYPES[sent], wanted, "safe"))


def _cast(array: np.ndarray, dtype: str, *, model: str, name: str) -> np.ndarray:
    """`array` (of a dtype `_castable` to `dtype`) as `dtype`; a float64 value beyond `dtype`'s
    range is refused, as it is in nested lists. Rounding to float32's precision is the cast's
    point: the model computes in float32 anyway."""
    global _cast_logged
    if tensors.dtype_name(array.dtype) == dtype or tensors.is_string(array):
        return array
    with np.errstate(over="ignore"):
        cast = array.astype(tensors.DTYPES[dtype])
    if not np.isfinite(cast).all() and np.isfinite(array).all():
        raise tensors.TensorError(f"{array.dtype.name} value out of range for dtype {dtype}")
    if not _cast_logged:
        _cast_logged = True
        log.info(
            "cast inputs of dtype %s to the signature's %s (model %r, input %r); "
            "later casts are not logged",
            array.dtype.name,
            dtype,
            model,
            name,
        )
    return cast


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
