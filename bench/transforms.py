"""Transforms over files (issue 27): a fleet's records/s against an in-process loop, and scaling.

    .venv/bin/python -m bench.transforms            # the issue's sizes: about forty minutes here
    .venv/bin/python -m bench.transforms --quick    # small files, N = 1, 2: a smoke test

(1) A Parquet file and a TFRecord file (`tf.train.Example`) of `--cnn-records` 64x64x3 float32
    images through a fleet (`tffleet api` + `tffleet worker` on cpu:1, SQLite, a file:// store;
    the transform created and waited on with `tffleet.Client`), records/s from the create to
    the end of the wait, against an in-process loop over the same file: the same reader
    (`tffleet.datasets.formats.read`, then `mapping.inputs`) and the model (`worker.runtime`,
    the child's threads) called at its best batch, which the fleet's model.toml is given too.
(2) `--mlp-records` one-row MLP inputs (1024 float32) in Parquet, the same way.
(3) On `bench.scaling`'s simulated device (a forward pass sleeps `--device-s` per batch, no
    CPU): N children on two hosts (its `Fleet`: PostgreSQL, its own Redis, an API) run one
    transform of N x `--shards-per-child` shards; records/s from the transform's create to its
    end (the database's clock), against N times one child's. The hosts start afresh for each
    N; with `--warm`, a transform of one batch a child runs first, unmeasured, so what each
    child's first shard costs once (its first claims and reads) is left out.

Rounds alternate the in-process loop and the fleet (this machine's speed drifts); each round's
ratio is to the loop run just before it. CPU per record comes from /proc: the client (this
process, while it waits), the API and the worker (all its processes), beside the loop's.
It exits non-zero only when something failed, never because of a ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.fleet_cpu import tree_cpu_s

CNN_SHAPE, MLP_IN = (64, 64, 3), 1024
CANDIDATES = (16, 32, 64, 128, 256, 512, 1024)
CHUNK = 1024  # records written at a time (and a Parquet row group)
TENANT = "default"  # the fleet's tenant with auth off


def _progress(message: str) -> None:
    print(f"... {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# The files


def _chunks(records: int, width: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, values of `width` float32 each) CHUNK records at a time, from a fixed seed."""
    rng = np.random.default_rng(seed)
    for start in range(0, records, CHUNK):
        count = min(CHUNK, records - start)
        yield np.arange(start, start + count), rng.random((count, width), dtype=np.float32)


def write_parquet(path: Path, column: str, records: int, width: int) -> None:
    """`id` (int64) and `column` (a fixed-size list of float32), row groups of CHUNK."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.int64()), (column, pa.list_(pa.float32(), width))])
    with pq.ParquetWriter(path, schema) as writer:
        for ids, values in _chunks(records, width, seed=0):
            pixels = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), width)
            writer.write_table(pa.table({"id": ids, column: pixels}, schema=schema))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example_bytes(features: dict[str, np.ndarray]) -> bytes:
    """A `tf.train.Example` of flat float32 or int64 features, encoded here with numpy (packed
    lists): the protobuf classes' per-value lists would take minutes for 100,000 images."""
    entries = b""
    for name, values in features.items():
        if values.dtype.kind == "f":
            feature = _field(2, _field(1, values.astype("<f4").tobytes()))  # float_list
        else:
            packed = b"".join(_varint(int(v) & (2**64 - 1)) for v in values.ravel())
            feature = _field(3, _field(1, packed))  # int64_list
        entries += _field(1, _field(1, name.encode()) + _field(2, feature))  # map entry
    return _field(1, entries)  # Example.features


def write_tfrecord(path: Path, column: str, records: int, width: int) -> None:
    """The same records as `write_parquet`'s, framed by TensorFlow's writer (its CRCs in C)."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for ids, values in _chunks(records, width, seed=0):
            for i, row in zip(ids, values, strict=True):
                writer.write(example_bytes({"id": np.array([i]), column: row}))


# The in-process loop


class Model:
    """A SavedModel loaded as a worker child loads it (worker.runtime, the child's threads)."""

    def __init__(self, path: Path) -> None:
        from worker.repository import ModelConfig, ModelSpec
        from worker.runtime import load

        self.runner = load(ModelSpec(path.parent.name, 1, path, "saved_model", ModelConfig()))

    def best_batch(self, seconds: float) -> tuple[int, dict[int, float]]:
        """The batch size at which the model alone runs most records a second (`seconds` at
        each candidate)."""
        rates = {}
        for size in CANDIDATES:
            batch = {
                name: np.random.default_rng(1).random((size, *spec["shape"][1:]), dtype=np.float32)
                for name, spec in self.runner.inputs.items()
            }
            self.runner.run(batch)  # traced and warmed
            started, runs = time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                self.runner.run(batch)
                runs += 1
            rates[size] = size * runs / (time.perf_counter() - started)
        return max(rates, key=rates.__getitem__), rates

    def loop(self, store: Path, uri: str, format: str, batch: int) -> tuple[float, float]:
        """Records/s and CPU ms per record of the plain loop: read a batch, map it, run it."""
        from tffleet.datasets import formats, mapping
        from tffleet.datasets.locations import resolve
        from tffleet.settings import Settings

        location = resolve(uri, TENANT, Settings(object_store=store.as_uri()))
        started, cpu = time.perf_counter(), time.process_time()
        info = formats.inspect(location, format)
        inputs = self.runner.inputs
        columns = mapping.resolve_columns(info.schema, inputs, None)
        wanted = list(columns.values())
        for read in formats.read(location, format, 0, info.records, wanted, batch, info=info):
            arrays, _, _ = mapping.inputs(read, inputs, columns)
            self.runner.run(arrays)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        return info.records / wall, cpu / info.records * 1000


# (1) and (2): the fleet against the loop


@dataclass
class Run:
    """One transform through the fleet (or one loop): records/s and CPU ms per record."""

    rate: float
    client_ms: float = 0.0
    api_ms: float = 0.0
    worker_ms: float = 0.0

    @property
    def cpu_ms(self) -> float:
        return self.client_ms + self.api_ms + self.worker_ms

    def __str__(self) -> str:
        return (
            f"{self.rate:8.0f} records/s; CPU per record: client {self.client_ms * 1000:5.1f} us,"
            f" API {self.api_ms * 1000:5.1f} us, worker {self.worker_ms * 1000:7.1f} us"
        )


def through_fleet(client: Any, pids: tuple[int, int], model: str, uri: str, records: int) -> Run:
    """Create a transform of the whole file, wait for it; its records/s and each part's CPU."""
    at = (time.perf_counter(), time.process_time(), *map(tree_cpu_s, pids))
    handle = client.transform(model, uri, format="parquet", key="id")
    done = handle.wait(timeout=3600)
    now = (time.perf_counter(), time.process_time(), *map(tree_cpu_s, pids))
    if not done.ok or done.records_succeeded != records:
        raise RuntimeError(f"{uri}: the transform ended {done.status}: {done.to_dict()}")
    wall, client_s, api_s, worker_s = (b - a for a, b in zip(at, now, strict=True))
    return Run(records / wall, *(s / records * 1000 for s in (client_s, api_s, worker_s)))


@dataclass
class Case:
    """One file through the fleet and the loop, round by round."""

    name: str
    model: str
    uri: str
    format: str
    records: int
    target: float
    batch: int = 0
    loops: list[Run] | None = None
    fleet: list[Run] | None = None

    def ratios(self) -> list[float]:
        assert self.loops is not None and self.fleet is not None
        return [f.rate / loop.rate for f, loop in zip(self.fleet, self.loops, strict=True)]


def fleet_cases(work: Path, args: argparse.Namespace) -> list[Case]:
    """(1) and (2): the files written, the best batches found, then rounds in turns."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    from bench.pipeline import Fleet
    from bench.run import build_models, start_redis
    from tffleet import Client
    from tffleet.cli.process_group import ProcessGroup
    from tffleet.devices import cpu_threads_per_child
    from worker import runtime

    runtime.configure_threads(intra_op=cpu_threads_per_child(1))  # as the fleet's one child
    repository, store = work / "models", work / "objects"
    build_models(repository)
    for name in ("mlp_unbatched", "tiny"):  # the worker loads only the CNN and the MLP
        shutil.rmtree(repository / name)
    folder = store / TENANT / "datasets"
    folder.mkdir(parents=True)
    cases = [
        Case("(1) CNN, Parquet", "cnn", "tffleet://datasets/cnn.parquet", "parquet",
             args.cnn_records, 0.9),
        Case("(1) CNN, TFRecord", "cnn", "tffleet://datasets/cnn.tfrecord", "tfrecord",
             args.cnn_records, 0.9),
        Case("(2) MLP, Parquet, one row each", "mlp", "tffleet://datasets/mlp.parquet",
             "parquet", args.mlp_records, 0.7),
    ]  # fmt: skip
    _progress(f"writing {args.cnn_records} images twice, {args.mlp_records} MLP rows")
    write_parquet(folder / "cnn.parquet", "image", args.cnn_records, int(np.prod(CNN_SHAPE)))
    write_tfrecord(folder / "cnn.tfrecord", "image", args.cnn_records, int(np.prod(CNN_SHAPE)))
    write_parquet(folder / "mlp.parquet", "x", args.mlp_records, MLP_IN)
    models = {name: Model(repository / name / "1") for name in ("cnn", "mlp")}
    for name, model in models.items():
        best, rates = model.best_batch(args.sweep_s)
        _progress(f"{name} alone, records/s by batch: { {k: round(v) for k, v in rates.items()} }")
        # The fleet's model runs at the same batch: its shards' reads and forward passes.
        (repository / name / "model.toml").write_text(f"max_batch_size = {best}\n")
        for case in cases:
            if case.model == name:
                case.batch = best
    group = ProcessGroup()
    fleet = None
    try:
        redis_url = f"redis://127.0.0.1:{start_redis(group, str(work))}/0"
        fleet = Fleet(work, repository, redis_url, "cpu:1")
        fleet.env["TFFLEET_OBJECT_STORE"] = store.as_uri()
        fleet.env["TFFLEET_TRANSFORM_SHARD_RECORDS"] = str(args.shard_records)
        fleet.start_api()
        fleet.start_worker(children=1)
        started = dict(fleet.group.started)
        pids = started["api"].pid, started["worker"].pid
        with Client(f"http://127.0.0.1:{fleet.port}") as client:
            for case in cases:
                case.loops, case.fleet = [], []
                for round_ in range(args.rounds):
                    rate, cpu = models[case.model].loop(store, case.uri, case.format, case.batch)
                    case.loops.append(Run(rate, worker_ms=cpu))
                    _progress(f"{case.name} round {round_ + 1}, in-process: {case.loops[-1]}")
                    case.fleet.append(through_fleet(client, pids, case.model, case.uri,
                                                    case.records))  # fmt: skip
                    _progress(f"{case.name} round {round_ + 1}, fleet:      {case.fleet[-1]}")
    finally:
        if fleet is not None:
            fleet.stop()
        group.stop()
    return cases


# (3) N children of the simulated device on two hosts


@dataclass
class Scaled:
    """One transform on N children: its records and the seconds from its create to its end."""

    n: int
    split: tuple[int, ...]
    records: int
    seconds: float
    children: int  # how many children ran one of its shards

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def scaling_rounds(work: Path, args: argparse.Namespace) -> list[Scaled]:
    """bench.scaling's fleet (PostgreSQL, two hosts) and device; one transform per N of
    N x `--shards-per-child` shards of `--sim-shard` records, each shard `--sim-shard /
    --batch` forward passes of `--device-s`."""
    from sqlalchemy import create_engine, text

    from bench import scaling
    from tffleet import Client

    repository, store = work / "sim-models", work / "sim-objects"
    timing = scaling.build_model(repository, args)
    _progress(f"simulated device: a batch of {args.batch} took {timing['wall_s']:.3f} s")
    folder = store / "bench" / "datasets"  # the tenant of bench.scaling's key
    folder.mkdir(parents=True)
    admin = create_engine(args.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {scaling.DATABASE} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {scaling.DATABASE}"))
    url = admin.url.set(database=scaling.DATABASE).render_as_string(hide_password=False)
    os.environ["TFFLEET_OBJECT_STORE"] = store.as_uri()  # its Fleet passes this environment on
    (work / "scaling").mkdir()
    fleet, rounds = None, []
    try:
        fleet = scaling.Fleet(work / "scaling", url, repository)
        with Client(f"http://127.0.0.1:{fleet.api_port}", api_key=fleet.key) as client:
            for n in args.n:
                records = n * args.shards_per_child * args.sim_shard
                write_parquet(folder / f"sim-{n}.parquet", "x", records,
                              scaling.WIDTH)  # fmt: skip
                if args.warm:  # a shard of one batch a child, run before the measured transform
                    write_parquet(folder / f"warm-{n}.parquet", "x", n * args.batch,
                                  scaling.WIDTH)  # fmt: skip
                rounds.append(_scaled(fleet, client, n, records, args))
                _progress(f"N={n}: {rounds[-1].rate:.0f} records/s")
    finally:
        if fleet is not None:
            fleet.close()
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {scaling.DATABASE} WITH (FORCE)"))
        admin.dispose()
    return rounds


def _scaled(fleet: Any, client: Any, n: int, records: int, args: argparse.Namespace) -> Scaled:
    from sqlalchemy import text

    from bench import scaling

    split = scaling.split_children(n)
    fleet.start_hosts(split)
    deadline = time.monotonic() + 900
    while fleet.ready_children() < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} children were not ready within 900 s")
        time.sleep(0.5)
    time.sleep(2.0)  # the last child's load and warm-up CPU is over
    if args.warm:
        warm = client.transform(
            scaling.MODEL, f"tffleet://datasets/warm-{n}.parquet", format="parquet",
            shard_records=args.batch,
        ).wait(timeout=300)  # fmt: skip
        with fleet.engine.connect() as conn:
            warmed = conn.scalar(
                text("SELECT count(DISTINCT split_part(worker, ' task ', 1)) FROM jobs "
                     "WHERE transform_id = :id"), {"id": warm.id}
            )  # fmt: skip
        _progress(f"N={n}: a warm-up transform ({warm.status}) ran on {warmed} children")
    handle = client.transform(
        scaling.MODEL, f"tffleet://datasets/sim-{n}.parquet", format="parquet",
        shard_records=args.sim_shard,
    )  # fmt: skip
    done = handle.wait(timeout=900)
    fleet.stop_hosts()
    if not done.ok or done.records_succeeded != records:
        raise RuntimeError(f"N={n}: the transform ended {done.status}: {done.to_dict()}")
    assert done.finished_at is not None
    with fleet.engine.connect() as conn:  # a job's `worker` is "<child> task <task id>"
        shards = conn.execute(
            text("SELECT worker, started_at, finished_at FROM jobs WHERE transform_id = :id "
                 "ORDER BY started_at"), {"id": done.id}
        ).all()  # fmt: skip
    names: dict[str, int] = {}
    for worker, began, ended in shards:  # where the time went, on the database's clock
        child = names.setdefault(worker.split(" task ", 1)[0], len(names))
        _progress(f"N={n}: child {child} ran a shard from {_since(done, began):.2f} s to "
                  f"{_since(done, ended):.2f} s after the create")  # fmt: skip
    seconds = (done.finished_at - done.created_at).total_seconds()
    children = len(names)
    return Scaled(n, split, records, seconds, children)


def _since(transform: Any, at: Any) -> float:
    """Seconds from the transform's create to `at` (a naive UTC time of the database)."""
    created = transform.created_at.replace(tzinfo=None)
    return float((at.replace(tzinfo=None) - created).total_seconds())


# The report


def case_rows(cases: list[Case]) -> list[tuple[str, float, str]]:
    """Each case's rounds printed; its ratios (each round's to the loop just before it)."""
    rows = []
    for case in cases:
        assert case.loops is not None and case.fleet is not None
        print(f"{case.name}: {case.records} records, batch {case.batch}")
        for i, (loop, fleet, ratio) in enumerate(
            zip(case.loops, case.fleet, case.ratios(), strict=True)
        ):
            print(f"  round {i + 1}  in-process {loop.rate:8.0f} records/s, CPU per record "
                  f"{loop.worker_ms * 1000:7.1f} us")  # fmt: skip
            print(f"           fleet      {fleet}  {ratio:.2f}x")
        cpu = statistics.median(f.cpu_ms for f in case.fleet)
        alone = statistics.median(loop.worker_ms for loop in case.loops)
        for i, ratio in enumerate(case.ratios()):
            rows.append((f"{case.name}, round {i + 1}", ratio, f">= {case.target}"))
        rows.append(("    ... CPU per record, in-process / the fleet's", alone / cpu,
                     f">= {case.target}"))  # fmt: skip
    return rows


def scaling_rows(rounds: list[Scaled], args: argparse.Namespace) -> list[tuple[str, float, str]]:
    """Each N's records/s against N x one child's (the first round's, N = 1)."""
    one = next((r for r in rounds if r.n == 1), None)
    bound = args.batch / args.device_s
    print(f"(3) simulated device, {args.device_s:g} s per batch of {args.batch} "
          f"({bound:.0f} records/s per child at most); shards of {args.sim_shard} records, "
          f"{args.shards_per_child} per child")  # fmt: skip
    rows = []
    for r in rounds:
        print(f"  N={r.n} ({'+'.join(map(str, r.split))}): {r.records} records in "
              f"{r.seconds:.1f} s, {r.rate:.0f} records/s ({r.rate / (r.n * bound):.2f} of the "
              f"device bound); its shards ran on {r.children} of {r.n} children")  # fmt: skip
        if one is not None and r.n > 1:
            rows.append((f"(3) N={r.n} vs N x one child", r.rate / (r.n * one.rate), ">= 0.9"))
    return rows


def report(cases: list[Case], rounds: list[Scaled], args: argparse.Namespace) -> None:
    print(f"\ntffleet transforms ({os.cpu_count()} CPUs)\n")
    rows = case_rows(cases) + scaling_rows(rounds, args) if rounds else case_rows(cases)
    print("\nratios (target)")
    for name, value, target in rows:
        print(f"  {name:50s} {value:6.2f}  ({target})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small files, N = 1, 2")
    parser.add_argument("--cnn-records", type=int, default=100_000)
    parser.add_argument("--mlp-records", type=int, default=1_000_000)
    parser.add_argument("--shard-records", type=int, default=10_000, help="(1), (2)")
    parser.add_argument("--rounds", type=int, default=2, help="(1), (2): in turns")
    parser.add_argument(
        "--sweep-s", type=float, default=1.0, help="(1), (2): seconds at each candidate batch"
    )
    parser.add_argument("--n", default="1,2,4,8", help="(3): children, comma-separated")
    parser.add_argument("--device-s", type=float, default=0.25, help="(3): per batch")
    parser.add_argument("--batch", type=int, default=256, help="(3): max_batch_size")
    parser.add_argument("--sim-shard", type=int, default=2048, help="(3): records per shard")
    parser.add_argument("--shards-per-child", type=int, default=4, help="(3)")
    parser.add_argument("--skip", choices=("fleet", "scaling"), help="leave (1)+(2) or (3) out")
    parser.add_argument(
        "--warm", action="store_true",
        help="(3): a transform of one batch a child first, unmeasured (each child's first shard)",
    )  # fmt: skip
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
        help="(3): a PostgreSQL server; the bench makes (and drops) a database of its own there",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.cnn_records, args.mlp_records, args.shard_records = 1024, 8192, 4096
        args.rounds, args.n, args.shards_per_child, args.sim_shard = 1, "1,2", 2, 1024
        args.sweep_s = 0.2
    args.n = [int(n) for n in args.n.split(",") if n.strip()]
    with tempfile.TemporaryDirectory(prefix="tffleet-bench-transforms-") as tmp:
        work = Path(tmp)
        cases = [] if args.skip == "fleet" else fleet_cases(work, args)
        rounds = [] if args.skip == "scaling" else scaling_rounds(work, args)
    report(cases, rounds, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
