"""The worker pipeline's figures: how busy the device is, how a big job and a bulk request spread.

    .venv/bin/python -m bench.pipeline            # about four minutes on two cores
    .venv/bin/python -m bench.pipeline --quick    # fewer jobs

(1) busy time: a backlog of CNN jobs (256 images of 64x64x3 each) is stored before the worker
    starts (`tffleet models register` lets the API take them); the worker (`--devices cpu:1`)
    then drains it. Its forward-pass seconds (`tffleet_device_busy_seconds_total`, from its
    metrics port) are set against the wall time from its first claim to its last result (the
    database's clock), and its samples/s against the in-process call at its best batch size.
(2) one big job on `--devices cpu:2`: a compute-heavy model with small inputs and a
    max_batch_size of 4,096; one 8,192-sample job against one 4,096-sample job, each alone on an
    idle fleet (median of three). Without a split, the 8,192 runs as two chunks on one child.
(3) one bulk request of 2,000 one-sample jobs on `--devices cpu:2`: how many each child ran.

Everything runs here: a private Redis, a SQLite file, the API, the worker, and this client.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from sqlalchemy import create_engine, text

from bench.rawhttp import Connection
from bench.run import CNN_SHAPE, build_models, in_process, start_redis
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port

HEAVY_IN = 16  # the compute-heavy model's input width: small inputs, much compute per sample


def build_heavy(repository: Path) -> None:
    """Small inputs, a lot of compute per sample: 16 -> 2048 -> 2048 -> 2048 -> 1."""
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input(shape=(HEAVY_IN,), name="x")
    h = x
    for _ in range(3):
        h = keras.layers.Dense(2048, activation="relu")(h)
    model = keras.Model(x, keras.layers.Dense(1)(h))
    model.export(str(repository / "heavy" / "1"), format="tf_saved_model", verbose=False)
    (repository / "heavy" / "model.toml").write_text(
        "max_batch_size = 4096\nbuckets = [1024, 2048, 4096]\n"
    )


class Fleet:
    """The API and a worker on this machine, started one part at a time."""

    def __init__(self, work: Path, repository: Path, redis_url: str, devices: str) -> None:
        self.group = ProcessGroup()
        self.port, self.metrics_port = free_port(), free_port()
        self.database_url = f"sqlite:///{work / f'bench-{self.port}.db'}"
        self.env = {
            "TFFLEET_DATABASE_URL": self.database_url,
            "TFFLEET_BROKER_URL": redis_url,
            "TFFLEET_MODEL_REPOSITORY": str(repository),
            "TFFLEET_DEVICES": devices,
            "TFFLEET_API_PORT": str(self.port),
            "TFFLEET_WORKER_METRICS_PORT": str(self.metrics_port),
            "TFFLEET_AUTH": "off",
            "TF_CPP_MIN_LOG_LEVEL": "3",
        }
        self.repository = repository
        self._cli("migrate")

    def _cli(self, *args: str) -> None:
        proc = self.group.start(args[0], [sys.executable, "-m", "tffleet.cli", *args], env=self.env)
        if proc.wait() != 0:
            raise RuntimeError(f"tffleet {' '.join(args)} failed")
        self.group.started.remove((args[0], proc))

    def register(self, model: str) -> None:
        self._cli("models", "register", str(self.repository / model / "1"))

    def start_api(self) -> None:
        cli = [sys.executable, "-m", "tffleet.cli"]
        self.group.start("api", [*cli, "api", "--log-level", "warning"], env=self.env)
        wait_for_port(self.port, timeout_s=60)

    def start_worker(self, children: int) -> None:
        """Start a worker and wait until each of its children loaded every model."""
        models = children * len(list(self.repository.iterdir()))
        cli = [sys.executable, "-m", "tffleet.cli"]
        self.group.start("worker", [*cli, "worker", "--log-level", "WARNING"], env=self.env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with create_engine(self.database_url).connect() as conn:
                loaded = conn.scalar(
                    text("SELECT count(*) FROM model_presence WHERE state = 'loaded'")
                )
            if (loaded or 0) >= models:
                return
            time.sleep(0.5)
        raise TimeoutError("the worker did not load its models")

    def busy_seconds(self) -> dict[str, float]:
        """tffleet_device_busy_seconds_total by device, from the worker's metrics port."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as page:
            body = page.read().decode()
        found: dict[str, float] = {}
        pattern = r'^tffleet_device_busy_seconds_total\{device="([^"]*)",model="[^"]*"\} (\S+)'
        for match in re.finditer(pattern, body, re.M):
            found[match[1]] = found.get(match[1], 0.0) + float(match[2])
        return found

    def query(self, sql: str) -> list[Any]:
        with create_engine(self.database_url).connect() as conn:
            return list(conn.execute(text(sql)).all())

    def stop(self) -> None:
        self.group.stop()


async def _post(fleet: Fleet, body: bytes, *, wait: bool = False) -> dict[str, Any]:
    """Submit; with `wait`, hold on until the job ends (POST ?wait=, then GET ?wait=)."""
    conn = await Connection.open("127.0.0.1", fleet.port)
    try:
        path = "/v1/jobs?wait=30" if wait else "/v1/jobs"
        response = await conn.request(conn.post_bytes(path, body))
        if response.status != 202:
            raise RuntimeError(f"submit answered {response.status}: {response.body[:300]!r}")
        job = dict(orjson.loads(response.body))
        while wait and job["status"] in ("queued", "running"):
            job = orjson.loads((await conn.get(f"/v1/jobs/{job['id']}?wait=30")).body)
        return job
    finally:
        await conn.close()


def _wait_all(fleet: Fleet, count: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ((done, failed),) = fleet.query(
            "SELECT sum(status = 'succeeded'), sum(status IN ('failed', 'canceled')) FROM jobs"
        )
        if failed:
            raise RuntimeError(f"{failed} jobs failed")
        if (done or 0) >= count:
            return
        time.sleep(0.2)
    raise TimeoutError("the jobs did not end")


def busy_time(work: Path, repository: Path, redis_url: str, *, jobs: int) -> dict[str, float]:
    fleet = Fleet(work, repository, redis_url, "cpu:1")
    try:
        fleet.register("cnn")
        fleet.start_api()
        images = np.random.default_rng(2).random(size=(256, *CNN_SHAPE), dtype=np.float32)
        envelope = {"b64": base64.b64encode(images.tobytes()).decode(), "dtype": "float32",
                    "shape": list(images.shape)}  # fmt: skip
        body = orjson.dumps({"model": "cnn", "inputs": {"image": envelope}})
        for _ in range(jobs):
            asyncio.run(_post(fleet, body))
        fleet.start_worker(children=1)
        _wait_all(fleet, jobs)
        busy = sum(fleet.busy_seconds().values())
        ((first, last),) = fleet.query("SELECT min(started_at), max(finished_at) FROM jobs")
        wall = (_time(last) - _time(first)).total_seconds()
        return {"busy_s": busy, "wall_s": wall, "samples_per_s": jobs * 256 / wall}
    finally:
        fleet.stop()


def _time(value: Any) -> Any:
    from datetime import datetime

    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def big_job(work: Path, repository: Path, redis_url: str, *, rounds: int) -> dict[str, float]:
    fleet = Fleet(work, repository, redis_url, "cpu:2")
    try:
        fleet.start_api()
        fleet.start_worker(children=2)
        rng = np.random.default_rng(4)
        times: dict[int, list[float]] = {4096: [], 8192: []}
        for samples in [4096, 8192] * (rounds + 1):
            x = rng.normal(size=(samples, HEAVY_IN)).astype(np.float32)
            envelope = {"b64": base64.b64encode(x.tobytes()).decode(), "dtype": "float32",
                        "shape": list(x.shape)}  # fmt: skip
            body = orjson.dumps({"model": "heavy", "inputs": {"x": envelope}})
            started = time.perf_counter()
            job = asyncio.run(_post(fleet, body, wait=True))
            if job["status"] != "succeeded":
                raise RuntimeError(f"a {samples}-sample job ended {job['status']}")
            times[samples].append(time.perf_counter() - started)
        # The first of each warms the path up.
        return {str(k): statistics.median(v[1:]) for k, v in times.items()}
    finally:
        fleet.stop()


def bulk_spread(work: Path, repository: Path, redis_url: str, *, jobs: int) -> dict[str, int]:
    fleet = Fleet(work, repository, redis_url, "cpu:2")
    try:
        fleet.start_api()
        fleet.start_worker(children=2)
        x = np.ones((1, 8), np.float32).tolist()
        asyncio.run(_post(fleet, orjson.dumps({"jobs": [{"model": "tiny", "inputs": x}] * 64})))
        _wait_all(fleet, 64)
        fleet.query("SELECT 1")
        before = {row[0] for row in fleet.query("SELECT id FROM jobs")}
        asyncio.run(_post(fleet, orjson.dumps({"jobs": [{"model": "tiny", "inputs": x}] * jobs})))
        _wait_all(fleet, jobs + 64)
        rows = fleet.query("SELECT id, worker FROM jobs")
        per_device = Counter(
            worker.split("/")[2] for job_id, worker in rows if job_id not in before and worker
        )
        return dict(sorted(per_device.items()))
    finally:
        fleet.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs: a smoke test")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)  # as the one child of (1) has
    tf.config.threading.set_inter_op_parallelism_threads(1)
    with tempfile.TemporaryDirectory(prefix="tffleet-bench-") as tmp:
        work = Path(tmp)
        repository = work / "models"
        print("... building the models", file=sys.stderr, flush=True)
        build_models(repository)
        build_heavy(repository)
        for name in ("mlp", "mlp_unbatched"):  # (1) loads only what it runs
            (repository / name).rename(work / name)
        group = ProcessGroup()
        redis_port = start_redis(group, tmp)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        try:
            print("... (1) in-process CNN", file=sys.stderr, flush=True)
            best = max(
                r.rate
                for r in in_process(repository / "cnn" / "1", CNN_SHAPE, (32, 64, 128)).values()
            )
            print(f"    in-process best: {best:.0f} samples/s", file=sys.stderr, flush=True)
            print("... (1) a CNN backlog", file=sys.stderr, flush=True)
            busy = busy_time(work, repository, redis_url, jobs=12 if args.quick else 48)
            print(f"    {busy}", file=sys.stderr, flush=True)
            print("... (2) one big job", file=sys.stderr, flush=True)
            big = big_job(work, repository, redis_url, rounds=1 if args.quick else 3)
            print(f"    {big}", file=sys.stderr, flush=True)
            print("... (3) one bulk request", file=sys.stderr, flush=True)
            spread = bulk_spread(work, repository, redis_url, jobs=2000)
        finally:
            group.stop()
    print(f"\ntffleet pipeline ({os.cpu_count()} CPUs)\n")
    print(
        f"(1) CNN backlog on cpu:1: forward passes {busy['busy_s']:.1f} s of "
        f"{busy['wall_s']:.1f} s wall; {busy['samples_per_s']:.0f} samples/s "
        f"(in-process at its best batch size: {best:.0f})"
    )
    print(
        f"(2) one job on cpu:2: 4,096 samples {big['4096']:.2f} s, "
        f"8,192 samples {big['8192']:.2f} s"
    )
    print(f"(3) one bulk request of 2,000 jobs on cpu:2, jobs per child: {spread}")
    print("\nratios (target)")
    rows = [
        ("(1) busy / wall", busy["busy_s"] / busy["wall_s"], ">= 0.9"),
        ("(1) backlog samples/s vs in-process best", busy["samples_per_s"] / best, ">= 0.8"),
        ("(2) 8,192-sample job vs 4,096-sample job", big["8192"] / big["4096"], "<= 1.25"),
        (
            "(3) the busier child's share of the bulk request",
            max(spread.values()) / sum(spread.values()),
            "about 0.5",
        ),
    ]
    for name, value, target in rows:
        print(f"  {name:50s} {value:6.2f}  ({target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
