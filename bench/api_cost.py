"""The API's CPU per job, by thread and to the nanosecond (issue 26 (1), issue 28's API share).

    .venv/bin/python -m bench.api_cost           # about two minutes on two cores
    .venv/bin/python -m bench.api_cost --quick   # a smoke test

One `tffleet api` alone (SQLite, a file:// store, a Redis of its own, no worker: the jobs stay
queued and are deleted after each batch), one keep-alive connection (bench/rawhttp.py), three
ways in turns, round by round: a one-sample JSON job of a one-input model (the fixed cost every
job pays), a 12.6 MB `.npy` body (256 images of 64x64x3 float32, streamed into the store), and
the same images as JSON with a base64 envelope (what issue 26's 0.25x is measured against). The
API's CPU comes from /proc/PID/task/*/schedstat, each thread's run time in nanoseconds (not
clock ticks), around each batch, less a quiet spell, and is split by thread: the event loop
(the main thread), the store's (obstore's tokio threads), the thread pools (SQL, the file's
writes, JSON parsing). bench.objects (1) measures the large ways too, with fewer jobs and 10 ms
ticks: this one is for figures a millisecond apart.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from bench.rawhttp import Connection, Response
from bench.transport import SETTLE_S, forget, register
from db import registry
from db.engine import make_engine, make_sessionmaker
from tffleet import tensors
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port

SAMPLES, IMAGE = 256, (64, 64, 3)
KINDS = ("loop", "pool", "store")


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """Run time in nanoseconds of each live thread of `pid`, summed by kind (KINDS)."""
    found = dict.fromkeys(KINDS, 0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            run_ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):  # ended meanwhile
            continue
        kind = "loop" if int(task.name) == pid else "store" if name.startswith("tokio") else "pool"
        found[kind] += run_ns
    return found


@dataclass
class Way:
    name: str
    send: Callable[[Connection], Awaitable[str]]
    per_round: int
    jobs: int = 0
    ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    ids: list[str] = field(default_factory=list)

    def ms(self, kind: str | None = None) -> float:
        spent = sum(self.ns.values()) if kind is None else self.ns[kind]
        return spent / max(self.jobs, 1) / 1e6


def _accepted(response: Response) -> str:
    if response.status != 202:
        raise RuntimeError(f"answered {response.status}: {response.body[:300]!r}")
    return str(orjson.loads(response.body)["id"])


def ways(conn: Connection, *, small: int, large: int) -> list[Way]:
    images = np.random.default_rng(0).random(size=(SAMPLES, *IMAGE), dtype=np.float32)
    envelope = {"b64": base64.b64encode(images.tobytes()).decode(), "dtype": "float32"}
    envelope["shape"] = list(images.shape)  # type: ignore[assignment]
    raw = {
        "small": conn.post_bytes(
            "/v1/jobs", orjson.dumps({"model": "one", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}})
        ),
        "npy": conn.post_bytes(
            "/v1/jobs?model=cnn", tensors.write_npy(images), content_type=tensors.NPY
        ),
        "json": conn.post_bytes(
            "/v1/jobs", orjson.dumps({"model": "cnn", "inputs": {"image": envelope}})
        ),
    }

    def plain(request: bytes) -> Callable[[Connection], Awaitable[str]]:
        async def send(c: Connection) -> str:
            return _accepted(await c.request(request))

        return send

    return [
        Way("small JSON job (one sample)", plain(raw["small"]), small),
        Way(".npy body, 12.6 MB", plain(raw["npy"]), large),
        Way("JSON + base64, 16.8 MB", plain(raw["json"]), large),
    ]


async def measure(
    port: int, api_key: str, pid: int, database_url: str, store: Path, *, rounds: int, scale: int
) -> list[Way]:
    conn = await Connection.open("127.0.0.1", port, api_key=api_key)
    sent = ways(conn, small=50 * scale, large=scale)
    for way in sent:  # warm: every path once, the signatures cached
        way.ids.append(await way.send(conn))
    await conn.close()

    def tidy() -> None:
        for way in sent:
            forget(database_url, way.ids)
        for child in store.iterdir():
            shutil.rmtree(child, ignore_errors=True)

    tidy()
    before = thread_cpu_ns(pid)
    await asyncio.sleep(SETTLE_S * 3)
    idle = {k: (v - before[k]) / 3 for k, v in thread_cpu_ns(pid).items()}
    for _ in range(rounds):
        for way in sent:
            # A connection per batch: uvicorn closes one idle for 5 s.
            conn = await Connection.open("127.0.0.1", port, api_key=api_key)
            start = thread_cpu_ns(pid)
            for _ in range(way.per_round):
                way.ids.append(await way.send(conn))
            await asyncio.sleep(SETTLE_S)  # the WAL checkpoint the batch caused lands in it
            for kind, spent in thread_cpu_ns(pid).items():
                way.ns[kind] += spent - start[kind] - int(idle[kind])
            await conn.close()
            way.jobs += way.per_round
            tidy()
            await asyncio.sleep(SETTLE_S)  # the checkpoint of the deletes, before the next batch
    return sent


def run(tmp: Path, redis_url: str, *, rounds: int, scale: int) -> list[Way]:
    from db.migrate import upgrade

    database_url, port, store = f"sqlite:///{tmp}/api.db", free_port(), tmp / "objects"
    store.mkdir()
    upgrade(database_url)
    api_key = register(database_url)
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        registry.register(
            session=session, name="one", version=1, format="savedmodel",
            inputs={"x": {"dtype": "float32", "shape": [-1, 4]}},
            outputs={"y": {"dtype": "float32", "shape": [-1, 2]}},
        )  # fmt: skip
    engine.dispose()
    env = {
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_API_PORT": str(port),
        "TFFLEET_OBJECT_STORE": f"file://{store}",
    }
    group = ProcessGroup()
    try:
        command = [sys.executable, "-m", "tffleet.cli", "api", "--log-level", "warning"]
        proc = group.start("api", command, env=env)
        wait_for_port(port, timeout_s=60)
        return asyncio.run(
            measure(port, api_key, proc.pid, database_url, store, rounds=rounds, scale=scale)
        )
    finally:
        group.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs: a smoke test")
    args = parser.parse_args(argv)
    rounds, scale = (1, 1) if args.quick else (6, 8)
    from bench.run import start_redis

    with tempfile.TemporaryDirectory(prefix="tffleet-bench-api-cost-") as tmp:
        group = ProcessGroup()
        try:
            redis_url = f"redis://127.0.0.1:{start_redis(group, tmp)}/0"
            sent = run(Path(tmp), redis_url, rounds=rounds, scale=scale)
        finally:
            group.stop()
    small, npy, json = sent
    print("\ntffleet API CPU per job, by thread (schedstat)")
    for way in sent:
        split = ", ".join(f"{kind} {way.ms(kind):6.2f}" for kind in KINDS)
        print(f"  {way.name:<30} {way.jobs:5d} jobs  {way.ms():7.2f} ms  ({split})")
    print("\nratios (target)")
    print(f"  .npy body vs JSON + base64, API CPU    {npy.ms() / json.ms():5.2f}  (<= 0.25)")
    print(f"  small JSON job, API CPU                {small.ms():5.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
