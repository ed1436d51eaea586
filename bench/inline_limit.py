"""What TFFLEET_INLINE_MAX_BYTES costs where it is low (issue 26 (3)): two `tffleet api`s side
by side, one at the old default (256 KiB) and one at the new (8 KiB), each alone (no worker),
SQLite and a file:// store, their CPU read from /proc around each batch as `bench.objects` (1)
reads it, the two measured in turns.

    .venv/bin/python -m bench.inline_limit           # about a minute
    .venv/bin/python -m bench.inline_limit --quick   # a smoke test

(a) A JSON job (base64 envelope) with a medium input, 1 and 4 CNN images of 64x64x3 float32
    (48 and 192 KiB): under 256 KiB it goes into the job's row; under 8 KiB the API writes it to
    the store first (an object and its row).
(b) The job's 256 x 10 float32 output (10 KiB) fetched back with `tffleet.Client.get`: inline in
    the job under 256 KiB, in the store under 8 KiB (the API reads it from there into the job's
    .npz answer; before, the client fetched the `.npy` with a second request,
    `GET /v1/jobs/{id}/outputs/{name}`): the API's CPU and the client's time per job fetched.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from bench.rawhttp import Connection
from bench.transport import SETTLE_S, api_cpu_s, forget, idle_cpu_s, register
from db import jobs
from db.engine import make_engine, make_sessionmaker
from db.models import DEFAULT_TENANT
from tffleet import tensors
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port
from tffleet.objectstore import keys, open_store

LIMITS = (256 * 1024, 8 * 1024)
IMAGE = (64, 64, 3)
OUTPUT = (256, 10)


@dataclass
class Api:
    limit: int
    port: int
    pid: int
    key: str
    database_url: str
    store_url: str
    idle: tuple[float, float] = (0.0, 0.0)
    cpu_s: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, cpu_s: float, wall_s: float, n: int) -> None:
        self.cpu_s[what] = self.cpu_s.get(what, 0.0) + cpu_s
        self.wall_s[what] = self.wall_s.get(what, 0.0) + wall_s
        self.count[what] = self.count.get(what, 0) + n

    def ms(self, what: str) -> tuple[float, float]:
        n = self.count[what]
        return self.cpu_s[what] / n * 1000, self.wall_s[what] / n * 1000


def start(group: ProcessGroup, tmp: Path, redis_url: str, limit: int) -> Api:
    from db.migrate import upgrade

    database_url, port = f"sqlite:///{tmp}/api-{limit}.db", free_port()
    upgrade(database_url)
    store_url = f"file://{tmp}/objects-{limit}"
    env = {
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_API_PORT": str(port),
        "TFFLEET_OBJECT_STORE": store_url,
        "TFFLEET_INLINE_MAX_BYTES": str(limit),
    }
    key = register(database_url)
    cli = [sys.executable, "-m", "tffleet.cli", "api", "--log-level", "warning"]
    proc = group.start(f"api-{limit}", cli, env=env)
    wait_for_port(port, timeout_s=60)
    return Api(limit, port, proc.pid, key, database_url, store_url)


def json_job(images: int) -> bytes:
    array = np.random.default_rng(images).random(size=(images, *IMAGE), dtype=np.float32)
    envelope = {"b64": base64.b64encode(array.tobytes()).decode(), "dtype": "float32",
                "shape": list(array.shape)}  # fmt: skip
    return orjson.dumps({"model": "cnn", "inputs": {"image": envelope}})


async def submit(api: Api, body: bytes, what: str, n: int) -> None:
    """`n` JSON jobs on one connection: the API's CPU (less its idle) and the client's wait."""
    conn = await Connection.open("127.0.0.1", api.port, api_key=api.key)
    ids = []
    user0, system0 = api_cpu_s(api.pid)
    started = time.perf_counter()
    for _ in range(n):
        answer = await conn.post("/v1/jobs", body)
        if answer.status != 202:
            raise RuntimeError(f"answered {answer.status}: {answer.body[:300]!r}")
        ids.append(orjson.loads(answer.body)["id"])
    wall = time.perf_counter() - started
    await asyncio.sleep(SETTLE_S)
    user1, system1 = api_cpu_s(api.pid)
    await conn.close()
    api.add(what, user1 - user0 + system1 - system0 - sum(api.idle), wall, n)
    forget(api.database_url, ids)


def finished_job(api: Api) -> str:
    """A job ended with a 256 x 10 float32 output, written as a worker writes one: inline
    under the API's limit, else an .npy in the store and a reference in the job."""
    job_id = asyncio.run(_submit_one(api, json_job(1)))
    engine = make_engine(api.database_url)
    sessions = make_sessionmaker(engine)
    output = np.random.default_rng(9).random(size=OUTPUT, dtype=np.float32)
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="bench", lease_s=600)
    if output.nbytes <= api.limit:
        blob = tensors.pack({"y": output})
    else:
        key = keys.output_key(DEFAULT_TENANT, job_id, "y")
        data, reference = tensors.npy_object(key, output)
        open_store(api.store_url).put(key, data)
        blob = tensors.pack({}, {"y": reference})
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, blob)])
    engine.dispose()
    return job_id


async def _submit_one(api: Api, body: bytes) -> str:
    conn = await Connection.open("127.0.0.1", api.port, api_key=api.key)
    answer = await conn.post("/v1/jobs", body)
    await conn.close()
    return str(orjson.loads(answer.body)["id"])


def fetch(api: Api, job_id: str, n: int) -> None:
    """`tffleet.Client.get` of the ended job `n` times: its output as an array either way."""
    from tffleet import Client

    with Client(f"http://127.0.0.1:{api.port}", api_key=api.key) as client:
        client.get(job_id)  # warm: the connection open
        user0, system0 = api_cpu_s(api.pid)
        started = time.perf_counter()
        for _ in range(n):
            job = client.get(job_id)
            assert job.outputs is not None and job.outputs["y"].shape == OUTPUT
        wall = time.perf_counter() - started
        time.sleep(SETTLE_S)
        user1, system1 = api_cpu_s(api.pid)
    api.add("fetch", user1 - user0 + system1 - system0 - sum(api.idle), wall, n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    args = parser.parse_args(argv)
    rounds, per_round = (1, 5) if args.quick else (4, 25)
    from bench.run import start_redis

    bodies = {f"JSON job, {n} image{'s' * (n > 1)} ({n * 48} KiB)": json_job(n) for n in (1, 4)}
    with tempfile.TemporaryDirectory(prefix="tffleet-bench-inline-") as tmp:
        group = ProcessGroup()
        try:
            redis_url = f"redis://127.0.0.1:{start_redis(group, tmp)}/0"
            apis = [start(group, Path(tmp), redis_url, limit) for limit in LIMITS]
            for api in apis:
                for body in bodies.values():  # warm: every path once
                    asyncio.run(_submit_one(api, body))
                api.idle = asyncio.run(idle_cpu_s(api.pid, spells=3))
            ended = {api.limit: finished_job(api) for api in apis}
            for _ in range(rounds):  # in turns: the machine's speed drifts
                for what, body in bodies.items():
                    for api in apis:
                        asyncio.run(submit(api, body, what, per_round))
                for api in apis:
                    fetch(api, ended[api.limit], per_round)
        finally:
            group.stop()
    print(f"\ntffleet inline limit: TFFLEET_INLINE_MAX_BYTES {LIMITS[0]} vs {LIMITS[1]}\n")
    print(f"  {'per job':<36} {'API CPU, ms':>22} {'client wall, ms':>22}")
    for what in [*bodies, "fetch"]:
        label = "Client.get, 256x10 float32 output" if what == "fetch" else what
        (cpu0, wall0), (cpu1, wall1) = (api.ms(what) for api in apis)
        print(
            f"  {label:<36} {cpu0:6.2f} -> {cpu1:6.2f} ({_ratio(cpu1, cpu0)}) "
            f"{wall0:6.2f} -> {wall1:6.2f} ({_ratio(wall1, wall0)})"
        )
    return 0


def _ratio(value: float, base: float) -> str:
    """`value / base`, or n/a: a few requests' CPU, read in clock ticks less a quiet spell's,
    may come to nothing (`--quick` on a fast machine)."""
    return f"{value / base:4.2f}x" if base > 0 else "  n/a"


if __name__ == "__main__":
    sys.exit(main())
