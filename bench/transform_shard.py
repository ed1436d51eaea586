"""A transform's shard in a child against an in-process loop over the same file (issue 27).

    .venv/bin/python -m bench.transform_shard [--records 8192] [--rounds 2]

A 64x64x3 CNN (bench/run.py's) reads a Parquet file and an .npy file of `--records` images from
a directory store. Both sides use the same reader (tffleet.datasets `formats.read`, then
`mapping.inputs`) and call the model at its best batch (the fastest per record of a few sizes,
measured first):

    in-process   read a batch, run it, the next: one thread, nothing else
    shard        the whole shard as one job run by `Batcher.run` (worker/transform.py): claimed
                 from SQLite, batch k+1 read ahead while k runs, outputs streamed into a Parquet
                 part, errors file, counts committed with the transform's

Rounds alternate the two (this machine's speed drifts); it prints records/s of each and their
ratio per round and the median ratio. The issue asks for the fleet at 0.9 or more of the loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SHAPE = (64, 64, 3)
CANDIDATES = (16, 32, 64, 128, 256)


def build_cnn(repository: Path) -> Path:
    """bench/run.py's CNN as a SavedModel: 3 conv + pool blocks, 10 outputs (fixed seed)."""
    import keras

    keras.utils.set_random_seed(0)
    image = keras.Input(shape=SHAPE, name="image")
    h = image
    for filters in (32, 64, 128):
        h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
        h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    path = repository / "cnn" / "1"
    keras.Model(image, keras.layers.Dense(10)(h)).export(
        str(path), format="tf_saved_model", verbose=False
    )
    return path


def write_inputs(directory: Path, records: int) -> None:
    """The same images as `cnn.parquet` (a fixed-size list column, row groups of 1024) and
    `cnn.npy`, under the tenant's datasets/ of a directory store."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    images = rng.random((records, *SHAPE), dtype=np.float32)
    flat = images.reshape(records, -1)
    pixels = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
    table = pa.table({"id": pa.array(np.arange(records)), "image": pixels})
    folder = directory / "default" / "datasets"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "cnn.parquet", row_group_size=1024)
    np.save(folder / "cnn.npy", images)


def best_batch(runner: Any) -> int:
    """The batch size at which the model runs most records a second."""
    rates = {}
    for size in CANDIDATES:
        batch = {"image": np.random.default_rng(1).random((size, *SHAPE), dtype=np.float32)}
        runner.run(batch)  # traced and warmed
        started, runs = time.perf_counter(), 0
        while time.perf_counter() - started < 1.0:
            runner.run(batch)
            runs += 1
        rates[size] = size * runs / (time.perf_counter() - started)
    best = max(rates, key=lambda size: rates[size])
    print("model alone, records/s by batch:", {k: round(v) for k, v in rates.items()})
    return best


def in_process(settings: Any, uri: str, format: str, runner: Any, batch: int) -> float:
    """Records/s of the plain loop: read a batch, map it, run it."""
    from db.models import DEFAULT_TENANT
    from tffleet.datasets import formats, mapping
    from tffleet.datasets.locations import resolve

    location = resolve(uri, DEFAULT_TENANT, settings)
    info = formats.inspect(location, format)
    columns = mapping.resolve_columns(info.schema, runner.inputs, _columns(format))
    started = time.perf_counter()
    for read in formats.read(location, format, 0, info.records, list(columns.values()), batch):
        arrays, _, _ = mapping.inputs(read, runner.inputs, columns)
        runner.run(arrays)
    return info.records / (time.perf_counter() - started)


def _columns(format: str) -> dict[str, str] | None:
    """The Parquet file's `image` column feeds the input; an .npy's one column does by itself."""
    return {"image": "image"} if format == "parquet" else None


def shard(sessions: Any, settings: Any, uri: str, format: str, runner: Any, batch: int) -> float:
    """Records/s of the file as one shard job run by a child's Batcher, claim to commit."""
    from db import transform_control
    from db.models import DEFAULT_TENANT
    from tffleet.datasets import formats
    from tffleet.datasets.locations import resolve
    from worker.batching import Batcher, BatchPolicy

    info = formats.inspect(resolve(uri, DEFAULT_TENANT, settings), format)
    key = "id" if format == "parquet" else None
    new = transform_control.NewTransform(
        tenant=DEFAULT_TENANT, model="cnn", version=1, priority=0,
        spec={"input": {"uri": uri, "format": format, "columns": _columns(format), "key": key},
              "output": {"format": "parquet"}},
        files=[{"uri": uri, "format": format, "info": info.to_json()}],
        output_uri=f"tffleet://transforms/{format}-{time.monotonic_ns()}",
        errors_uri="", shard_records=info.records, batch_records=batch,
    )  # fmt: skip
    with sessions.begin() as session:
        _, ids = transform_control.create(session=session, new=new)
    batcher = Batcher(
        sessions=sessions, owner="bench", lease_s=30, notify=lambda ended: None, settings=settings
    )
    policy = BatchPolicy(max_batch_size=batch, max_queue_delay_ms=0, buckets=(batch,))
    started = time.perf_counter()
    report = batcher.run(model="cnn", version=1, job_ids=ids, runner=runner, policy=policy)
    elapsed = time.perf_counter() - started
    assert report.succeeded == 1, report
    return info.records / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="tffleet-bench-") as tmp:
        run(Path(tmp), args)


def run(tmp: Path, args: argparse.Namespace) -> None:
    from db import tenants
    from db.engine import make_engine, make_sessionmaker
    from db.migrate import upgrade
    from db.models import DEFAULT_TENANT
    from tffleet.settings import Settings
    from worker import runtime
    from worker.repository import ModelConfig, ModelSpec

    store = tmp / "objects"
    write_inputs(store, args.records)
    settings = Settings(object_store=store.as_uri())
    database_url = f"sqlite:///{tmp / 'bench.db'}"
    upgrade(database_url)
    sessions = make_sessionmaker(make_engine(database_url))
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=DEFAULT_TENANT)
    path = build_cnn(tmp / "models")
    runner = runtime.load(ModelSpec("cnn", 1, path, "saved_model", ModelConfig()))
    batch = best_batch(runner)
    print(f"{args.records} images of {SHAPE}, batch {batch}, {os.cpu_count()} CPUs")
    for format in ("parquet", "npy"):
        uri = f"tffleet://datasets/cnn.{format}"
        ratios = []
        for round_ in range(args.rounds):
            alone = in_process(settings, uri, format, runner, batch)
            fleet = shard(sessions, settings, uri, format, runner, batch)
            ratios.append(fleet / alone)
            print(
                f"{format:8} round {round_ + 1}: in-process {alone:8.0f} records/s, "
                f"shard {fleet:8.0f} records/s, ratio {fleet / alone:.3f}"
            )
        print(f"{format:8} median ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
