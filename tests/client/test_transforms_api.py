"""Transforms from the client against the real API (`tffleet api` in a subprocess, `served`), its
shards run by `FakeShardWorker`: a dataset put, a transform waited for, its output read back
(and checked against `fake_model` run here), bad records, cancel, the async client, and what the
API refuses."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.client.fleet import NO_WAIT, Served, fake_model
from tests.client.shard_worker import FakeShardWorker
from tffleet import AsyncClient, Client
from tffleet.client import Conflict, InvalidInput, NotFound

pytestmark = pytest.mark.slow

X = (np.arange(40, dtype=np.float32).reshape(10, 4) / 7).astype(np.float32)


@pytest.fixture
def shards(served: Served) -> Iterator[FakeShardWorker]:
    fake = FakeShardWorker(served.database_url, served.redis_url, served.object_store)
    yield fake
    fake.close()


@pytest.fixture
def client(served: Served) -> Iterator[Client]:
    with Client(served.url, api_key=served.api_key, retries=NO_WAIT) as opened:
        yield opened


def parquet(x: np.ndarray) -> bytes:
    table = pa.table(
        {
            "id": [f"r{i}" for i in range(len(x))],
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_a_dataset_put_is_transformed_and_read_back(
    client: Client, shards: FakeShardWorker, tmp_path: Path
) -> None:
    source = tmp_path / "rows.parquet"
    source.write_bytes(parquet(X))
    uri = client.put_dataset(source, "tffleet://datasets/t1/rows.parquet")
    assert uri == "tffleet://datasets/t1/rows.parquet"
    with pytest.raises(Conflict, match="overwrite"):
        client.put_dataset(source, "t1/rows.parquet")

    shards.serve()
    handle = client.transform(
        "double", uri, columns={"x": "features"}, key="id", format="parquet", shard_records=4
    )
    assert handle.transform.status == "queued" and handle.transform.shards_total == 3
    done = handle.wait(timeout=30, progress=False)
    assert (done.status, done.records, done.records_succeeded, done.records_failed) == (
        "succeeded", 10, 10, 0,
    )  # fmt: skip
    assert done.shards_done == 3 and done.progress == 1.0

    table = handle.read()
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(10)]
    arrays = handle.arrays()
    expected = fake_model({"x": X})
    np.testing.assert_allclose(arrays["y"], expected["y"])
    np.testing.assert_array_equal(arrays["argmax"], expected["argmax"])
    assert [f["name"] for f in handle.files()] == [f"part-{i:05d}.parquet" for i in range(3)]
    assert handle.errors() == []
    assert client.get_transform(handle.id).transform.status == "succeeded"
    assert handle.id in [t.id for t in client.transforms(limit=10)]


def test_bad_records_are_left_out_and_listed(
    client: Client, shards: FakeShardWorker, tmp_path: Path
) -> None:
    lines = [f'{{"id": "k{i}", "x": [{i}, 1, 2, 3]}}' for i in range(8)]
    lines[2] = '{"id": "k2", "x": [1, 2]}'  # two values, not four
    lines[5] = '{"id": "k5", "x": [1, 2, 3, NaN]}'  # not JSON at all
    client.put_dataset("\n".join(lines).encode() + b"\n", "t2/rows.jsonl")
    shards.serve()
    handle = client.transform(
        "double", "tffleet://datasets/t2/rows.jsonl", key="id", format="jsonl"
    )
    done = handle.wait(timeout=30, progress=False)
    assert (done.status, done.records_succeeded, done.records_failed) == ("succeeded", 6, 2)
    table = handle.read()
    assert table.column("id").to_pylist() == ["k0", "k1", "k3", "k4", "k6", "k7"]
    errors = handle.errors()
    assert [e["index"] for e in errors] == [2, 5]
    assert all(e["reason"] for e in errors)
    saved = handle.download(tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in saved) == [
        "errors/part-00000.jsonl",
        "part-00000.jsonl",
    ]


def test_what_the_api_refuses_raises_naming_the_field(client: Client) -> None:
    client.put_dataset(parquet(X), "t3/rows.parquet")
    before = len(client.transforms(limit=1000))
    with pytest.raises(InvalidInput, match="columns"):
        client.transform("double", "tffleet://datasets/t3/rows.parquet", columns={"x": "id"})
    with pytest.raises(InvalidInput):
        client.transform("double", "https://example.com/rows.parquet")
    with pytest.raises(NotFound):
        client.get_transform("0190c2d4-aaaa-7000-8000-000000000001")
    assert len(client.transforms(limit=1000)) == before  # a refusal leaves no transform


def test_a_canceled_transform_runs_no_more_shards(client: Client, shards: FakeShardWorker) -> None:
    client.put_dataset(parquet(X), "t4/rows.parquet")
    handle = client.transform(
        "double", "tffleet://datasets/t4/rows.parquet", columns={"x": "features"}, shard_records=2
    )
    canceled = handle.cancel()
    assert canceled.status == "canceled"
    assert shards.queued() == []
    assert handle.wait(timeout=10, progress=False).status == "canceled"
    assert handle.read().num_rows == 0


@pytest.mark.anyio
async def test_the_async_client_runs_one_too(served: Served, shards: FakeShardWorker) -> None:
    shards.serve()
    async with AsyncClient(served.url, api_key=served.api_key, retries=NO_WAIT) as client:
        uri = await client.put_dataset(parquet(X), "t5/rows.parquet")
        handle = await client.transform("double", uri, columns={"x": "features"}, format="npy")
        done = await handle.wait(timeout=30, progress=False)
        arrays = await handle.arrays()
    assert done.status == "succeeded"
    np.testing.assert_allclose(arrays["output"], fake_model({"x": X})["y"])
