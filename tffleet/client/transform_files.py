"""A transform's output read back through the API (`GET /v1/transforms/{id}/files[/{name}]`):
plans that list and fetch its files, and what turns them into a table or arrays.

The parts come in shard order, which is input order, so the table's rows are the input's records
in order, less the bad ones (in the errors files, by index and key). A Parquet or JSON Lines
part holds the key (or `index`) column beside the outputs; an `.npy` part one output alone.
Everything is read into memory: for outputs too large for that, read the parts where they lie.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np
import orjson

from tffleet.client.errors import ProtocolError
from tffleet.client.protocol import Call, Plan, Retries, send

if TYPE_CHECKING:
    import pyarrow as pa

# The column an .npy part's array is named by in `read_table` and `arrays`: the file holds
# no name of its own.
NPY_COLUMN = "output"


def list_files(transform_id: str, *, retries: Retries) -> Plan[list[dict[str, str]]]:
    """`[{"name", "kind"}]`: the parts (kind `part`), then the errors files (`errors`)."""
    path = f"/v1/transforms/{quote(transform_id, safe='')}/files"
    data = yield from send(Call("GET", path), retries)
    try:
        return [{"name": str(f["name"]), "kind": str(f["kind"])} for f in data["files"]]
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"not a file list: {exc!r} in {str(data)[:200]}") from None


def fetch(transform_id: str, name: str, *, retries: Retries) -> Plan[bytes]:
    path = f"/v1/transforms/{quote(transform_id, safe='')}/files/{quote(name, safe='/')}"
    data = yield from send(Call("GET", path), retries, raw=True)
    return bytes(data)


def fetch_kind(transform_id: str, kind: str, *, retries: Retries) -> Plan[list[bytes]]:
    """Every file of one kind (`part` or `errors`), in shard order."""
    files = yield from list_files(transform_id, retries=retries)
    found: list[bytes] = []
    for file in files:
        if file["kind"] == kind:
            found.append((yield from fetch(transform_id, file["name"], retries=retries)))
    return found


def save(folder: str | os.PathLike[str], name: str, data: bytes) -> Path:
    """A fetched file written under `folder` by its name (`errors/` made as needed)."""
    target = Path(folder, *name.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def read_table(format: str, parts: Sequence[bytes]) -> pa.Table:
    """The parts as one pyarrow Table, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if format == "parquet":
        tables = [pq.read_table(pa.BufferReader(part)) for part in parts]
        return pa.concat_tables(tables) if tables else pa.table({})
    if format == "jsonl":
        return pa.Table.from_pylist(read_jsonl(parts))
    if format == "npy":
        arrays = read_npy(parts)
        return pa.table({NPY_COLUMN: _arrow(arrays)}) if arrays is not None else pa.table({})
    raise ProtocolError(f"an output format the client cannot read: {format!r}")


def read_arrays(format: str, parts: Sequence[bytes]) -> dict[str, np.ndarray]:
    """The parts as NumPy arrays by column, records first: a tensor column with its shape."""
    if format == "npy":
        whole = read_npy(parts)
        return {NPY_COLUMN: whole} if whole is not None else {}
    table = read_table(format, parts)
    return {name: column_array(table.column(name)) for name in table.column_names}


def read_errors(files: Sequence[bytes]) -> list[dict[str, Any]]:
    """The errors files' records in input order (within a batch a worker lists the records
    that did not parse before those that did not fit)."""
    return sorted(read_jsonl(files), key=lambda error: int(error.get("index", -1)))


def read_jsonl(parts: Sequence[bytes]) -> list[dict[str, Any]]:
    try:
        return [orjson.loads(line) for part in parts for line in part.splitlines() if line]
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"a JSON Lines file that is not: {exc}") from None


def read_npy(parts: Sequence[bytes]) -> np.ndarray | None:
    if not parts:
        return None
    try:
        arrays = [np.load(io.BytesIO(part), allow_pickle=False) for part in parts]
    except ValueError as exc:
        raise ProtocolError(f"an .npy part that is not: {exc}") from None
    return np.concatenate(arrays)


def column_array(column: Any) -> np.ndarray:
    """A pyarrow column as an array: fixed-size lists (a tensor per record, how parts hold
    them) unnested into dimensions, lists of JSON Lines read row by row, scalars as they are."""
    import pyarrow as pa

    combined = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    shape = [len(combined)]
    flat = combined
    while pa.types.is_fixed_size_list(flat.type):
        shape.append(flat.type.list_size)
        flat = flat.flatten()
    if len(shape) > 1:
        return flat.to_numpy(zero_copy_only=False).reshape(shape)
    if pa.types.is_list(flat.type) or pa.types.is_large_list(flat.type):
        return np.array(flat.to_pylist())
    return np.asarray(flat.to_numpy(zero_copy_only=False))


def _arrow(array: np.ndarray) -> Any:
    import pyarrow as pa

    flat = pa.array(array.reshape(-1))
    for size in reversed(array.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat
