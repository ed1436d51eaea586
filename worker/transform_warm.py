"""What a child's first transform shard would pay once, paid at the child's start instead.

A shard's reader and part writer (worker/transform_io.py) reach code that Python and pyarrow load
on first use: `pyarrow.compute` (its functions are made with their docstrings when it is
imported: 50 ms of CPU here, the larger part) and `numpy.ma`, which pyarrow imports lazily too;
the first Parquet read and write set up what pyarrow keeps for the next. In a fresh child that
was 0.1 to 0.15 s of CPU in its first shard, and eight fresh children paying it at once on two
cores made the first shards of a transform 0.3 to 0.6 s longer than the rest (docs/how-to/
benchmarks.md, "Transforms over files"). `warm_up` runs a two-record Parquet file through the
same reader and writer in memory, in a few tens of milliseconds, before the child takes a task;
the model's forward pass at each padded size is warmed by the model set (worker/model_set.py).
"""

from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger(__name__)

# A model input as a signature gives it, for the mapping's conversion.
_SIGNATURE = {"x": {"dtype": "float32", "shape": [-1, 4]}}


def warm_up() -> float:
    """Write and read back a tiny Parquet part in memory, as a shard does; the seconds it took.
    Never raises: a child that cannot warm up runs its first shard cold, nothing worse."""
    started = time.perf_counter()
    try:
        _round_trip()
    except Exception as exc:  # pyarrow or obstore missing a piece: not this child's concern
        log.warning(
            "transform warm-up failed (%s: %s); the first shard runs cold", type(exc).__name__, exc
        )
    return time.perf_counter() - started


def _round_trip() -> None:
    import pyarrow.compute  # noqa: F401  (imported on first use by pyarrow otherwise)
    from obstore.store import MemoryStore

    from tffleet.datasets import formats, mapping, writers
    from tffleet.datasets.locations import Location
    from tffleet.objectstore import ObjectStore

    store = ObjectStore("memory:///", MemoryStore(), presigns=False)
    part = Location(store=store, key="warm.parquet", uri="memory:///warm.parquet")
    records: dict[str, np.ndarray] = {
        "x": np.zeros((2, 4), dtype=np.float32),
        "index": np.arange(2, dtype=np.int64),
    }
    if writers.write_part(part, "parquet", [records]) != 2:
        raise RuntimeError("the warm-up part holds the wrong number of records")
    for batch in formats.read(part, "parquet", 0, 2, ["x"], 2):
        mapping.inputs(batch, _SIGNATURE, {"x": "x"})
