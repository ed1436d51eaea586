"""Which column of a dataset feeds which model input, checked before anything is stored, and
each batch's columns made into the inputs (cast, reshaped), a record that will not go in being
reported, not raised.

`columns` maps an input's name to a column's (`{"image": "pixels"}`); an input it leaves out is
fed by the column of its own name, and a model of one input reading a file of one column (an
.npy's `array`) takes that column. A column fits an input when its dtype casts to the input's
without changing kind the wrong way (ints to floats yes, floats to ints or strings to numbers
no) and one record's value has the input's shape without its batch dimension: the same dims
(-1 on either side matches any), or the same number of values (a flat list of 12288 floats
feeds a 64x64x3 image).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tffleet.datasets.base import Batch, Column
from tffleet.tensors.arrays import STRING, as_bytes


def resolve_columns(
    schema: Mapping[str, Column], signature: Mapping[str, Any], columns: Mapping[str, str] | None
) -> dict[str, str]:
    """{input: column} with the defaults filled in (no check that the columns exist)."""
    columns = dict(columns or {})
    if len(signature) == 1 and len(schema) == 1 and not columns:
        return {next(iter(signature)): next(iter(schema))}
    return {name: columns.get(name, name) for name in signature}


def check(
    schema: Mapping[str, Column],
    signature: Mapping[str, Any],
    columns: Mapping[str, str] | None = None,
    *,
    key: str | None = None,
) -> list[str]:
    """What keeps this file from feeding this model, one message per problem naming the column
    and the input (empty: it fits). `signature`: {input: {"dtype", "shape"}} as registered."""
    errors = [
        f"columns.{name}: the model has no input {name!r} (it takes {sorted(signature)})"
        for name in sorted(set(columns or {}) - set(signature))
    ]
    for name, column_name in resolve_columns(schema, signature, columns).items():
        column = schema.get(column_name)
        where = f"columns.{name}: column {column_name!r}"
        if column is None:
            errors.append(f"{where} is not in the file (it has {sorted(schema)})")
            continue
        spec = signature[name]
        if not castable(column.dtype, spec["dtype"]):
            errors.append(f"{where} is {column.dtype}; input {name!r} takes {spec['dtype']}")
        expected = tuple(spec.get("shape") or [-1])[1:]
        if not shape_fits(column.shape, expected):
            errors.append(
                f"{where} has records of shape {list(column.shape)}; input {name!r} takes "
                f"{list(expected)} per record"
            )
    if key is not None and key not in schema:
        errors.append(f"key: column {key!r} is not in the file (it has {sorted(schema)})")
    return errors


def castable(column: str, input: str) -> bool:
    if STRING in (column, input):
        return column == input
    return bool(np.can_cast(np.dtype(column), np.dtype(input), casting="same_kind"))


def shape_fits(column: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    if len(column) == len(expected) and all(
        -1 in (have, want) or have == want for have, want in zip(column, expected, strict=True)
    ):
        return True
    if -1 in column or -1 in expected:
        return -1 in column and _size(column, expected)
    return int(np.prod(column, dtype=np.int64)) == int(np.prod(expected, dtype=np.int64))


def _size(column: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """A column whose records vary may still fit, record by record (checked in `inputs`), when
    the input's per-record shape is known."""
    return -1 not in expected or len(column) == len(expected)


def inputs(
    batch: Batch, signature: Mapping[str, Any], mapping: Mapping[str, str]
) -> tuple[dict[str, np.ndarray], np.ndarray, list[tuple[int, str]]]:
    """A batch's columns as the model's inputs (`mapping` from `resolve_columns`): the arrays,
    the positions in the batch of the records they hold, and the records left out, as
    (record number, reason): a value of the wrong size, or not finite."""
    keep = np.ones(len(batch), dtype=bool)
    reasons: dict[int, str] = {}
    converted: dict[str, list[Any] | np.ndarray] = {}
    for name, column in mapping.items():
        spec = signature[name]
        per_record = tuple(spec.get("shape") or [-1])[1:]
        values = batch.columns[column]
        if values.dtype != object or spec["dtype"] == STRING:
            converted[name] = _whole(values, spec["dtype"], per_record, column, keep, reasons)
        else:
            converted[name] = _each(values, spec["dtype"], per_record, column, keep, reasons)
    rows = np.flatnonzero(keep)
    arrays = {
        name: np.stack([values[i] for i in rows]) if isinstance(values, list) else values[rows]
        for name, values in converted.items()
    }
    errors = [(int(batch.index[i]), reasons[i]) for i in sorted(reasons)]
    return arrays, rows, errors


def _whole(
    values: np.ndarray, dtype: str, shape: tuple[int, ...], column: str, keep: np.ndarray,
    reasons: dict[int, str],
) -> np.ndarray:  # fmt: skip
    values = as_bytes(values) if dtype == STRING else values.astype(dtype, copy=False)
    if values.shape[1:] != shape and -1 not in shape:
        values = values.reshape((len(values), *shape))
    if values.dtype.kind == "f":
        # Over each record's values (a batch of no good record too: reshape(0, -1) raises).
        finite = np.isfinite(values).all(axis=tuple(range(1, values.ndim)))
        for i in np.flatnonzero(~finite & keep).tolist():
            reasons[i] = f"column {column!r}: NaN or infinity"
        keep &= finite
    return values


def _each(
    values: np.ndarray, dtype: str, shape: tuple[int, ...], column: str, keep: np.ndarray,
    reasons: dict[int, str],
) -> list[Any]:  # fmt: skip
    out: list[Any] = []
    for i, value in enumerate(values):
        try:
            array = np.asarray(value).astype(dtype)
        except (ValueError, TypeError):
            reasons.setdefault(i, f"column {column!r}: not {dtype}")
            keep[i] = False
            out.append(None)
            continue
        if -1 not in shape and array.shape != shape:
            if array.size != int(np.prod(shape, dtype=np.int64)):
                reasons.setdefault(
                    i, f"column {column!r}: {array.size} values, input takes {list(shape)}"
                )
                keep[i] = False
                out.append(None)
                continue
            array = array.reshape(shape)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            reasons.setdefault(i, f"column {column!r}: NaN or infinity")
            keep[i] = False
        out.append(array)
    return out
