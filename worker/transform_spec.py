"""A shard job's spec, read back: which records of which file it runs, where its part goes.

A transform's shard is an ordinary job whose inputs blob is no packed tensors but a small JSON
spec (`db.transforms.pack_shard_spec`, DESIGN §14): the file (its URI, format and the `FileInfo`
the API's inspect gave), the record range `[start, stop)`, which column feeds which input, the
key column, and the URIs of its output part and errors file. Here it becomes a `ShardSpec`, its
URIs resolved against what this worker allows (`tffleet.datasets.locations`, under the job's
tenant): the worker trusts no URI more than the API did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from db import transforms
from db.jobs import Lease
from tffleet import tensors
from tffleet.datasets import formats, mapping
from tffleet.datasets.base import FileInfo
from tffleet.datasets.locations import Location, resolve
from tffleet.settings import Settings

# The column of an output part that carries each record's number when the transform names no key.
INDEX_COLUMN = "index"


@dataclass(frozen=True)
class ShardSpec:
    """One shard, resolved: read `[start, stop)` of `source`, write `part` (and `errors`)."""

    transform: str
    shard: int
    source: Location
    format: str
    info: FileInfo
    start: int
    stop: int
    # {input: column}, every input of the model named (defaults filled in).
    columns: dict[str, str]
    key: str | None
    part: Location
    output_format: str
    errors: Location
    batch_records: int

    @property
    def records(self) -> int:
        return self.stop - self.start

    @property
    def read_columns(self) -> list[str]:
        """The file's columns the shard reads (each once), the key aside."""
        return list(dict.fromkeys(self.columns.values()))

    @property
    def carried(self) -> str:
        """The name of the column that ties an output row to its record: the key's, or `index`."""
        return self.key or INDEX_COLUMN


def is_shard(lease: Lease) -> bool:
    """Whether a claimed job is a transform's shard (its inputs a spec, not tensors)."""
    return transforms.is_shard_spec(lease.inputs)


def split_shards(leases: Sequence[Lease]) -> tuple[list[Lease], list[Lease]]:
    """The shards among claimed jobs, and the others: a shard runs alone (worker/transform.py)."""
    shards: list[Lease] = []
    others: list[Lease] = []
    for lease in leases:
        (shards if is_shard(lease) else others).append(lease)
    return shards, others


def read_spec(
    lease: Lease, *, signature: Mapping[str, Any], settings: Settings, default_batch: int
) -> ShardSpec:
    """The shard a lease holds, its URIs resolved for the job's tenant. A spec that does not
    parse, or names a location this worker refuses, is a ValueError (the shard's own fault)."""
    raw = transforms.shard_spec(lease.inputs)
    if raw is None:
        raise ValueError(f"job {lease.job_id} is not a transform's shard")
    tenant = lease.tenant or ""
    try:
        file, output = raw["file"], raw["output"]
        info = formats.info_from_json(file["info"])
        start, stop = int(raw["start"]), int(raw["stop"])
        key = raw.get("key") or None
        batch = int(raw.get("batch_records") or default_batch)
        spec = ShardSpec(
            transform=str(raw["transform"]),
            shard=int(raw["shard"]),
            source=resolve(file["uri"], tenant, settings),
            format=formats.check_format(file["format"]),
            info=info,
            start=start,
            stop=stop,
            columns=mapping.resolve_columns(info.schema, signature, raw.get("columns")),
            key=key,
            part=resolve(raw["part_uri"], tenant, settings, write=True),
            output_format=formats.check_format(output["format"], output=True),
            errors=resolve(raw["errors_uri"], tenant, settings, write=True),
            batch_records=max(1, batch),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a shard spec without {exc}") from None
    if not 0 <= start <= stop <= info.records:
        raise ValueError(f"records [{start}, {stop}) are not a range of {info.records}")
    return spec


def counts(records: int, succeeded: int, failed: int) -> bytes:
    """A finished shard's outputs: its counts, packed as int64 scalars (GET /v1/jobs/{id} shows
    them as any job's outputs)."""
    return tensors.pack(
        {
            "records": np.array(records, dtype=np.int64),
            "succeeded": np.array(succeeded, dtype=np.int64),
            "failed": np.array(failed, dtype=np.int64),
        }
    )
