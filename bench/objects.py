"""Tensors by reference (issue 26): what a 12.6 MB job costs the API, how fast uploaded inputs
run through a fleet, and how little the database grows, side by side in one run.

    .venv/bin/python -m bench.objects              # about four minutes on two cores
    .venv/bin/python -m bench.objects --quick      # fewer requests and jobs: a smoke test
    .venv/bin/python -m bench.objects --api-only   # (1) alone, without TensorFlow

(1) The API's CPU per CNN job (256 images of 64x64x3 float32, 12.6 MB) sent three ways: JSON
    with a base64 envelope, an .npy body (streamed into the object store as it arrives), and an
    upload (`POST /v1/uploads`) followed by a JSON job naming it `{"uri": ...}` (both requests
    counted). One `tffleet api` (no worker: the jobs stay queued), SQLite, a file:// store, one
    lean keep-alive connection (`bench/rawhttp.py`); the ways interleaved round by round and the
    API's CPU read from /proc around each batch, less a quiet spell, as `bench.transport` does.
(2) 16 CNN jobs of 256 images on a fleet (`tffleet api` + `tffleet worker` on cpu:1, SQLite, a
    file:// store): inputs uploaded beforehand and submitted as JSON by reference from the lean
    client, and through `tffleet.Client` with plain arrays (it uploads each itself); samples/s
    from the first submit to the last result, against the in-process call at its best batch.
(3) The database's growth per job of (2): its live pages (page_count less the free list, WAL
    included) before and after, and what the jobs' rows hold.

Each load client prints its own CPU per job; the API's and the worker's (all its processes)
come from /proc, so the split of the two cores between them shows where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from sqlalchemy import create_engine, text

from bench.rawhttp import Connection, Response
from bench.transport import SETTLE_S, api_cpu_s, forget, idle_cpu_s, register
from tffleet import tensors
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port

SAMPLES, IMAGE = 256, (64, 64, 3)
JOBS = 16


def _accepted(response: Response, status: int = 202) -> dict[str, Any]:
    if response.status != status:
        raise RuntimeError(f"answered {response.status}: {response.body[:300]!r}")
    return dict(orjson.loads(response.body))


def by_reference(uri: str) -> bytes:
    """A JSON CNN job whose input names an upload."""
    return orjson.dumps({"model": "cnn", "inputs": {"image": {"uri": uri}}})


# (1) The API's CPU per 12.6 MB job


@dataclass
class Way:
    """One way of sending a job: `send` makes its requests on a connection, returns its id."""

    name: str
    send: Callable[[Connection], Awaitable[str]]
    size: int  # bytes sent per job
    user_s: float = 0.0
    system_s: float = 0.0
    jobs: int = 0
    ids: list[str] = field(default_factory=list)

    @property
    def cpu_ms(self) -> float:
        return (self.user_s + self.system_s) / self.jobs * 1000

    def row(self, baseline: Way) -> str:
        user, system = self.user_s / self.jobs * 1000, self.system_s / self.jobs * 1000
        return (
            f"  {self.name:<36} {self.size / 1e6:5.1f} MB  {self.cpu_ms:6.1f} ms "
            f"(user {user:5.1f}, kernel {system:5.1f})  {self.cpu_ms / baseline.cpu_ms:5.2f}x"
        )


def ways(conn: Connection, images: np.ndarray) -> list[Way]:
    """JSON + base64, an .npy body, an upload then JSON by reference: each request encoded
    once here (the upload's JSON job, a few bytes, once its URI is known)."""
    b64 = base64.b64encode(images.tobytes()).decode()
    envelope = {"b64": b64, "dtype": "float32", "shape": list(images.shape)}
    as_json = conn.post_bytes(
        "/v1/jobs", orjson.dumps({"model": "cnn", "inputs": {"image": envelope}})
    )
    npy = tensors.write_npy(images)
    as_npy = conn.post_bytes("/v1/jobs?model=cnn", npy, content_type=tensors.NPY)
    upload = conn.post_bytes("/v1/uploads", npy, content_type=tensors.NPY)

    def plain(raw: bytes) -> Callable[[Connection], Awaitable[str]]:
        async def send(c: Connection) -> str:
            return str(_accepted(await c.request(raw))["id"])

        return send

    async def uploaded(c: Connection) -> str:
        uri = _accepted(await c.request(upload), 201)["uri"]
        return str(_accepted(await c.post("/v1/jobs", by_reference(uri)))["id"])

    body = len(as_json) - len(as_json.split(b"\r\n\r\n", 1)[0])
    return [
        Way("JSON + base64 envelope", plain(as_json), body),
        Way(".npy body (streamed into the store)", plain(as_npy), len(npy)),
        Way("upload + JSON by reference", uploaded, len(npy)),
    ]


async def api_cpu(
    port: int, api_key: str, pid: int, database_url: str, store: Path, rounds: int, per_round: int
) -> list[Way]:
    images = np.random.default_rng(0).random(size=(SAMPLES, *IMAGE), dtype=np.float32)
    conn = await Connection.open("127.0.0.1", port, api_key=api_key)
    sent = ways(conn, images)
    for way in sent:  # warm: every path once, the signature cached
        way.ids.append(await way.send(conn))
    await conn.close()

    def tidy() -> None:
        """Not measured: the batch's jobs deleted, the store emptied, so neither grows."""
        for way in sent:
            forget(database_url, way.ids)
        for child in store.iterdir():
            shutil.rmtree(child, ignore_errors=True)

    tidy()
    idle = await idle_cpu_s(pid, spells=5)
    for _ in range(rounds):
        for way in sent:
            # A connection per batch: the server closes one idle for 5 s (uvicorn's keep-alive).
            conn = await Connection.open("127.0.0.1", port, api_key=api_key)
            user0, system0 = api_cpu_s(pid)
            for _ in range(per_round):
                way.ids.append(await way.send(conn))
            await asyncio.sleep(SETTLE_S)  # the WAL checkpoint the batch caused lands in it
            user1, system1 = api_cpu_s(pid)
            await conn.close()
            way.user_s += user1 - user0 - idle[0]
            way.system_s += system1 - system0 - idle[1]
            way.jobs += per_round
            tidy()
    return sent


def run_api_cpu(tmp: Path, redis_url: str, *, rounds: int, per_round: int) -> list[Way]:
    """A `tffleet api` alone on a SQLite file and a file:// store under `tmp`."""
    group = ProcessGroup()
    database_url, store, port = f"sqlite:///{tmp}/api.db", tmp / "api-objects", free_port()
    store.mkdir()
    from db.migrate import upgrade

    upgrade(database_url)
    api_key = register(database_url)
    env = {
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_OBJECT_STORE": f"file://{store}",
        "TFFLEET_API_PORT": str(port),
    }
    try:
        proc = group.start("api", [sys.executable, "-m", "tffleet.cli", "api",
                                   "--log-level", "warning"], env=env)  # fmt: skip
        wait_for_port(port, timeout_s=60)
        return asyncio.run(api_cpu(port, api_key, proc.pid, database_url, store, rounds, per_round))
    finally:
        group.stop()


# (2) 16 CNN jobs through a fleet, (3) what they leave in the database

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user and kernel) of `root` and every live process under it."""
    parent, cpu = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        pid = int(entry.name)
        parent[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) * _TICK_S
    total = 0.0
    for pid, seconds in cpu.items():
        up = pid
        while up not in (root, 0, 1) and up in parent:
            up = parent[up]
        total += seconds if up == root else 0.0
    return total


@dataclass
class Load:
    """One timed round of JOBS jobs: samples/s, and each party's CPU per job."""

    samples_per_s: float
    client_ms: float
    api_ms: float
    worker_ms: float

    def __str__(self) -> str:
        return (
            f"{self.samples_per_s:6.0f} samples/s; CPU per job: client {self.client_ms:5.1f} ms, "
            f"API {self.api_ms:5.1f} ms, worker {self.worker_ms:6.1f} ms"
        )


class Meter:
    """Wall time and CPU (this client, the API, the worker's processes) from `start` to `stop`."""

    def __init__(self, api_pid: int, worker_pid: int) -> None:
        self.pids = api_pid, worker_pid

    def start(self) -> None:
        self._at = (time.perf_counter(), time.process_time(), *map(tree_cpu_s, self.pids))

    def stop(self, jobs: int) -> Load:
        now = (time.perf_counter(), time.process_time(), *map(tree_cpu_s, self.pids))
        wall, client, api, worker = (b - a for a, b in zip(self._at, now, strict=True))
        return Load(jobs * SAMPLES / wall, *(s / jobs * 1000 for s in (client, api, worker)))


async def _submit_and_wait(conn: Connection, body: bytes) -> None:
    job = _accepted(await conn.post("/v1/jobs?wait=30", body))
    while job["status"] in ("queued", "running"):
        job = _accepted(await conn.get(f"/v1/jobs/{job['id']}?wait=30"), 200)
    if job["status"] != "succeeded":
        raise RuntimeError(f"a job ended {job['status']}: {job.get('error')}")


async def uploaded_round(port: int, images: np.ndarray, meter: Meter, jobs: int) -> Load:
    """Upload `jobs` copies of the images (not timed), then submit a JSON job naming each, all
    at once on a connection each, and wait for them all (timed)."""
    conns = [await Connection.open("127.0.0.1", port) for _ in range(jobs)]
    upload = conns[0].post_bytes("/v1/uploads", tensors.write_npy(images), content_type=tensors.NPY)
    uris = [_accepted(await conns[0].request(upload), 201)["uri"] for _ in range(jobs)]
    meter.start()
    await asyncio.gather(
        *(_submit_and_wait(c, by_reference(u)) for c, u in zip(conns, uris, strict=True))
    )
    load = meter.stop(jobs)
    for conn in conns:
        await conn.close()
    return load


def client_round(url: str, images: np.ndarray, meter: Meter, jobs: int) -> Load:
    """`tffleet.Client` given a plain array, as a user would: it uploads each (over its inline
    limit), submits the job by reference, then waits for them all."""
    from tffleet import Client

    with Client(url) as client:
        meter.start()
        submitted = [client.submit("cnn", {"image": images}) for _ in range(jobs)]
        ended = client.wait_all([job.id for job in submitted])
        load = meter.stop(jobs)
    if any(job.status != "succeeded" for job in ended):
        raise RuntimeError("a job of tffleet.Client did not succeed")
    return load


def live_bytes(database_url: str) -> int:
    """The SQLite database's pages in use (WAL included: read through a connection)."""
    with create_engine(database_url).connect() as conn:
        pages = conn.scalar(text("PRAGMA page_count")) - conn.scalar(text("PRAGMA freelist_count"))
        return int(pages * conn.scalar(text("PRAGMA page_size")))


def run_fleet(work: Path, repository: Path, redis_url: str, *, rounds: int) -> dict[str, Any]:
    from bench.pipeline import Fleet

    fleet = Fleet(work, repository, redis_url, "cpu:1")
    fleet.env["TFFLEET_OBJECT_STORE"] = f"file://{work / 'fleet-objects'}"
    images = np.random.default_rng(2).random(size=(SAMPLES, *IMAGE), dtype=np.float32)
    url = f"http://127.0.0.1:{fleet.port}"
    try:
        fleet.start_api()
        fleet.start_worker(children=1)
        pids = {name: proc.pid for name, proc in fleet.group.started}
        meter = Meter(pids["api"], pids["worker"])
        asyncio.run(uploaded_round(fleet.port, images, meter, 2))  # warm: every path once
        client_round(url, images, meter, 2)
        count = "SELECT count(*) FROM jobs"
        before, jobs_before = live_bytes(fleet.database_url), fleet.query(count)[0][0]
        loads: dict[str, list[Load]] = {"uploaded": [], "client": []}
        for _ in range(rounds):  # in turns: this machine's speed drifts from minute to minute
            loads["uploaded"].append(asyncio.run(uploaded_round(fleet.port, images, meter, JOBS)))
            print(f"    uploads by reference: {loads['uploaded'][-1]}", file=sys.stderr)
            loads["client"].append(client_round(url, images, meter, JOBS))
            print(f"    tffleet.Client:       {loads['client'][-1]}", file=sys.stderr)
        after, jobs_after = live_bytes(fleet.database_url), fleet.query(count)[0][0]
        ((inputs,),) = fleet.query("SELECT avg(length(data)) FROM job_inputs")
        ((outputs,),) = fleet.query(
            "SELECT avg(length(outputs)) FROM jobs WHERE outputs IS NOT NULL"
        )
        jobs = jobs_after - jobs_before
        return {
            "loads": loads,
            "db_per_job": (after - before) / jobs,
            "db_jobs": jobs,
            "inputs_blob": float(inputs or 0),
            "outputs_blob": float(outputs or 0),
        }
    finally:
        fleet.stop()


def in_process_best(repository: Path) -> float:
    """The in-process SavedModel call at its best batch, samples/s (as `bench.run` (1))."""
    from bench.run import CNN_SHAPE, in_process

    return max(
        r.rate for r in in_process(repository / "cnn" / "1", CNN_SHAPE, (32, 64, 128)).values()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and jobs")
    parser.add_argument("--api-only", action="store_true", help="(1) alone: no TensorFlow")
    args = parser.parse_args(argv)
    rounds, per_round = (1, 2) if args.quick else (4, 4)
    from bench.run import start_redis

    with tempfile.TemporaryDirectory(prefix="tffleet-bench-objects-") as tmp:
        work, group = Path(tmp), ProcessGroup()
        redis_url = f"redis://127.0.0.1:{start_redis(group, tmp)}/0"
        try:
            print("... (1) the API's CPU per 12.6 MB job", file=sys.stderr, flush=True)
            sent = run_api_cpu(work, redis_url, rounds=rounds, per_round=per_round)
            fleet = None if args.api_only else fleet_figures(work, redis_url, args.quick)
        finally:
            group.stop()
    report(sent, fleet, rounds * per_round)
    return 0


def fleet_figures(work: Path, redis_url: str, quick: bool) -> dict[str, Any]:
    """(2) and (3): the in-process call before and after the fleet's rounds, the fleet between."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    import tensorflow as tf

    from bench.run import build_models

    tf.config.threading.set_intra_op_parallelism_threads(2)  # as the fleet's one child has
    tf.config.threading.set_inter_op_parallelism_threads(1)
    repository = work / "models"
    print("... building the models", file=sys.stderr, flush=True)
    build_models(repository)
    for name in ("mlp", "mlp_unbatched", "tiny"):  # the worker loads only the CNN
        shutil.rmtree(repository / name)
    print("... (2) in-process CNN", file=sys.stderr, flush=True)
    best = [in_process_best(repository)]
    print(f"... (2) {JOBS} CNN jobs through a fleet, in turns", file=sys.stderr, flush=True)
    figures = run_fleet(work, repository, redis_url, rounds=1 if quick else 3)
    best.append(in_process_best(repository))
    return {**figures, "in_process": best}


def report(sent: list[Way], fleet: dict[str, Any] | None, jobs: int) -> None:
    print(f"\ntffleet objects ({os.cpu_count()} CPUs)\n")
    print(f"(1) the API's CPU per CNN job of {SAMPLES} x {IMAGE} float32, {jobs} jobs each way")
    for way in sent:
        print(way.row(sent[0]))
    rows = [("(1) .npy body vs JSON + base64, API CPU", sent[1].cpu_ms / sent[0].cpu_ms, "<= 0.25"),
            ("(1) upload + by reference vs JSON + base64", sent[2].cpu_ms / sent[0].cpu_ms,
             "<= 0.25")]  # fmt: skip
    if fleet is not None:
        best = max(fleet["in_process"])
        before, after = fleet["in_process"]
        print(f"(2) {JOBS} CNN jobs of {SAMPLES} images on cpu:1, round by round; in-process at "
              f"its best batch {before:.0f} samples/s before, {after:.0f} after")  # fmt: skip
        medians = {}
        for kind, label in (("uploaded", "uploads by reference"), ("client", "tffleet.Client")):
            for load in fleet["loads"][kind]:
                print(f"  {label:<22} {load}")
            medians[kind] = statistics.median(load.samples_per_s for load in fleet["loads"][kind])
        print(
            f"(3) the database grew {fleet['db_per_job'] / 1024:.1f} KB per job "
            f"({fleet['db_jobs']} jobs); a job's inputs blob {fleet['inputs_blob']:.0f} B, its "
            f"outputs {fleet['outputs_blob']:.0f} B (256 x 10 float32, inline under "
            "TFFLEET_INLINE_MAX_BYTES)"
        )
        rows += [
            ("(2) uploads by reference vs in-process best", medians["uploaded"] / best, ">= 0.9"),
            ("(2) tffleet.Client, plain arrays, vs in-process", medians["client"] / best, ">= 0.8"),
            ("(3) database growth per job, KB", fleet["db_per_job"] / 1024, "< 4"),
        ]
    print("\nratios (target)")
    for name, value, target in rows:
        print(f"  {name:50s} {value:6.2f}  ({target})")


if __name__ == "__main__":
    sys.exit(main())
