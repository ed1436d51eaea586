"""End to end: transforms over a Parquet file and an .npy file, submitted over HTTP, run by a real
worker with real TensorFlow (issue 27): every good record's output in the parts once, in input
order, with its key; the bad one in the errors file; the counts on the transform.

The files are put in the fleet's store (a directory) under the tenant's datasets/, as
`tffleet datasets put` puts them; the outputs are read back from the store and compared with the
model run in-process.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from db.models import DEFAULT_TENANT
from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp
from tffleet.objectstore import ObjectStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.parametrize("object_store_url", ["file"], indirect=True),
]

RECORDS = 100
BAD = 37  # a record whose features hold NaN


@pytest.fixture
def fleet(
    fleet_factory: Callable[..., Fleet], sqlite_url: str, object_store_url: str, tmp_path: Path
) -> Iterator[tuple[Fleet, Any]]:
    """An API and a worker (one CPU child) over the test's store, serving the mlp."""
    model = build_mlp(tmp_path / "models")
    fleet = fleet_factory(sqlite_url, tmp_path / "models", devices="cpu:1")
    fleet.start_api()
    fleet.start_worker()
    yield fleet, model


def features() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((RECORDS, 8)).astype(np.float32)


def run_transform(fleet: Fleet, body: dict[str, Any]) -> dict[str, Any]:
    """Submit a transform and wait for its end."""
    with fleet.http(timeout=60) as client:
        response = client.post("/v1/transforms", json=body)
        assert response.status_code == 202, response.text
        transform_id = response.json()["id"]
        for _ in range(8):
            out: dict[str, Any] = client.get(f"/v1/transforms/{transform_id}?wait=30").json()
            if out["status"] in ("succeeded", "failed", "canceled"):
                return out
    raise AssertionError(f"transform {transform_id} did not end: {out}")


def parts(store: ObjectStore, transform_id: str, suffix: str) -> list[bytes]:
    prefix = f"{DEFAULT_TENANT}/transforms/{transform_id}/"
    names = sorted(k for k in store.keys(prefix) if k.endswith(suffix) and "/errors/" not in k)
    return [bytes(store.get(name)) for name in names]


def test_a_parquet_and_an_npy_transform_run_end_to_end(
    fleet: tuple[Fleet, Any], object_store: ObjectStore
) -> None:
    running, model = fleet
    x = features()
    x[BAD, 2] = np.nan
    table = pa.table(
        {
            "id": pa.array([f"row-{i}" for i in range(RECORDS)]),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=32)
    object_store.put(f"{DEFAULT_TENANT}/datasets/e2e/in.parquet", sink.getvalue())
    clean = features()
    object_store.put(f"{DEFAULT_TENANT}/datasets/e2e/in.npy", _npy(clean))

    done = run_transform(
        running,
        {
            "model": "mlp",
            "input": {"uri": "tffleet://datasets/e2e/in.parquet",
                      "columns": {"x": "features"}, "key": "id"},
            "output": {"format": "parquet"},
            "shard_records": 40,
        },
    )  # fmt: skip
    assert done["status"] == "succeeded", done
    assert done["counts"] == {"records": RECORDS, "succeeded": RECORDS - 1, "failed": 1}
    assert done["shards"]["done"] == 3
    files = parts(object_store, done["id"], ".parquet")
    assert len(files) == 3, "a part per shard"
    got = pa.concat_tables(pq.read_table(io.BytesIO(data)) for data in files)
    good = [i for i in range(RECORDS) if i != BAD]
    assert got.column("id").to_pylist() == [f"row-{i}" for i in good], "input order, once each"
    expected = np.asarray(model(x[good]))
    (output,) = [name for name in got.column_names if name != "id"]
    np.testing.assert_allclose(
        np.array(got.column(output).to_pylist()), expected, rtol=1e-5, atol=1e-6
    )
    errors_key = f"{DEFAULT_TENANT}/transforms/{done['id']}/errors/part-00000.jsonl"
    (error,) = [orjson.loads(line) for line in bytes(object_store.get(errors_key)).splitlines()]
    assert (error["index"], error["key"]) == (BAD, f"row-{BAD}") and "NaN" in error["reason"]

    done = run_transform(
        running,
        {"model": "mlp", "input": {"uri": "tffleet://datasets/e2e/in.npy"},
         "output": {"format": "npy"}, "shard_records": 64},
    )  # fmt: skip
    assert done["status"] == "succeeded", done
    assert done["counts"] == {"records": RECORDS, "succeeded": RECORDS, "failed": 0}
    arrays = [np.load(io.BytesIO(p)) for p in parts(object_store, done["id"], ".npy")]
    assert [len(a) for a in arrays] == [64, RECORDS - 64]
    np.testing.assert_allclose(
        np.concatenate(arrays), np.asarray(model(clean)), rtol=1e-5, atol=1e-6
    )


def _npy(array: np.ndarray) -> bytes:
    sink = io.BytesIO()
    np.save(sink, array, allow_pickle=False)
    return sink.getvalue()
