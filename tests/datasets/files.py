"""Dataset files as bytes, written with pyarrow, numpy and by hand (CSV, JSON Lines, TFRecord)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tffleet.datasets import example
from tffleet.datasets.tfrecord import frame


def parquet(table: pa.Table, row_group_size: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


def images(records: int, shape: tuple[int, ...] = (4, 4, 3)) -> np.ndarray:
    """Records whose every value tells its record number (record i holds i + j / 1000)."""
    size = int(np.prod(shape))
    values = np.arange(records)[:, None] + np.arange(size)[None, :] / 1000
    return values.astype(np.float32).reshape((records, *shape))


def npy(array: np.ndarray) -> bytes:
    sink = io.BytesIO()
    np.save(sink, array, allow_pickle=False)
    return sink.getvalue()


def tfrecord(records: list[bytes]) -> bytes:
    return b"".join(frame(record) for record in records)


def examples(records: int) -> list[bytes]:
    return [
        example.encode({"x": images(1)[0].ravel() + i, "id": [i], "name": [f"r{i}".encode()]})
        for i in range(records)
    ]
