"""Output parts and errors files: read back as written, and whole or not at all."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import orjson
import pytest

from tests.datasets.conftest import TENANT
from tffleet.datasets import formats
from tffleet.datasets.locations import Location, resolve
from tffleet.datasets.writers import write_errors, write_part
from tffleet.settings import Settings


def part(settings: Settings, name: str) -> Location:
    return resolve(f"tffleet://transforms/t1/{name}", TENANT, settings, write=True)


def outputs(first: int, rows: int) -> dict[str, np.ndarray]:
    index = np.arange(first, first + rows, dtype=np.int64)
    scores = (index[:, None] + np.arange(3)[None, :] / 10).astype(np.float32)
    return {"index": index, "scores": scores}


@pytest.mark.parametrize("format", ["parquet", "jsonl"])
def test_a_part_reads_back_in_order(settings: Settings, format: str) -> None:
    where = part(settings, f"part-00000.{format}")
    assert write_part(where, format, [outputs(0, 100), outputs(100, 50)]) == 150
    info = formats.inspect(where, format)
    assert info.records == 150
    batches = list(formats.read(where, format, 0, 150, ["index", "scores"], 1000, info=info))
    np.testing.assert_array_equal(np.concatenate([b.columns["index"] for b in batches]), range(150))
    scores = np.concatenate([b.columns["scores"] for b in batches])
    np.testing.assert_allclose(scores, outputs(0, 150)["scores"], rtol=1e-6)


def test_an_npy_part(settings: Settings) -> None:
    where = part(settings, "part-00000.npy")
    write_part(where, "npy", [{"y": outputs(0, 10)["scores"]}, {"y": outputs(10, 5)["scores"]}])
    np.testing.assert_array_equal(
        next(formats.read(where, "npy", 0, 15, None, 100)).columns["array"],
        outputs(0, 15)["scores"],
    )
    with pytest.raises(ValueError, match="one column"):
        write_part(part(settings, "two.npy"), "npy", [outputs(0, 2)])
    assert part(settings, "two.npy").store.size(part(settings, "two.npy").key) is None


def failing(batches: int, format: str) -> Iterator[dict[str, np.ndarray]]:
    """Batches that end in a fault, as a shard's run that dies mid-part (an .npy: one column)."""
    for k in range(batches):
        batch = outputs(k * 1000, 1000)
        batch["scores"] = np.repeat(batch["scores"], 100, axis=1)  # 1.2 MB a batch
        yield {"y": batch["scores"]} if format == "npy" else batch
    raise RuntimeError("the device failed")


@pytest.mark.parametrize("format", ["parquet", "jsonl", "npy"])
def test_a_failure_mid_part_leaves_no_part(settings: Settings, format: str) -> None:
    where = part(settings, f"part-00001.{format}")
    # Enough batches to pass a multipart upload's first part on S3 (PART_BYTES).
    with pytest.raises(RuntimeError, match="the device failed"):
        write_part(where, format, failing(10, format))
    assert where.store.size(where.key) is None
    assert where.store.keys("acme/transforms/t1/") == []
    # A whole part already under the key stays as it was.
    write_part(where, format, [next(failing(1, format))])
    before = bytes(where.store.get(where.key))
    with pytest.raises(RuntimeError, match="the device failed"):
        write_part(where, format, failing(10, format))
    assert bytes(where.store.get(where.key)) == before


@pytest.mark.parametrize("format", ["parquet", "jsonl", "npy"])
def test_a_part_of_no_batch_is_no_part(settings: Settings, format: str) -> None:
    # A shard whose records were all bad has no outputs: no file, empty or not, in any format.
    where = part(settings, f"part-00002.{format}")
    assert write_part(where, format, []) == 0
    assert where.store.size(where.key) is None


def test_the_errors_file(settings: Settings) -> None:
    where = part(settings, "errors-00000.jsonl")
    errors = [(3, b"k3", "column 'x': NaN or infinity"), (np.int64(7), None, "not an object")]
    assert write_errors(where, errors) == 2
    lines = [orjson.loads(line) for line in bytes(where.store.get(where.key)).splitlines()]
    assert lines == [
        {"index": 3, "key": "k3", "reason": "column 'x': NaN or infinity"},
        {"index": 7, "key": None, "reason": "not an object"},
    ]


def test_an_output_format_is_checked(settings: Settings) -> None:
    with pytest.raises(ValueError, match="format 'csv': expected one of parquet, jsonl, npy"):
        write_part(part(settings, "p.csv"), "csv", [])
