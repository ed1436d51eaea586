"""What a queued job's `queue_position` and `eta_s` cost a read: the in-process app on a scratch
SQLite file (or PostgreSQL) with a deep queue.

    .venv/bin/python -m bench.standing [--jobs 10000] [--database-url postgresql+psycopg://...]

Stores `--jobs` queued one-sample jobs of one model version in three tenants (and 200 finished
ones, for a recent throughput), starts a Redis of its own and the app, then times (median of
300, after a warm-up) a GET of one queued job near the back of the queue, a GET of a finished
job, and a listing of 100 queued jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import numpy as np
from sqlalchemy import update
from sqlalchemy.engine import make_url

from api.app import create_app
from bench.scratch import scratch_database
from db import clock, jobs, registry, tenants
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import Job
from tffleet import tensors
from tffleet.settings import Settings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


def _fill(url: str, count: int) -> tuple[str, str, str]:
    """Stores the jobs; returns an admin key, a queued job near the back and a finished job."""
    upgrade(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        registry.register(
            session=session, name="m", version=1, format="savedmodel",
            inputs={"x": {"dtype": "float32", "shape": [-1, 4]}},
            outputs={"y": {"dtype": "float32", "shape": [-1, 2]}},
        )  # fmt: skip
        for name in ("a", "b", "c"):
            tenants.ensure_tenant(session=session, name=name)
        key = tenants.create_key(session=session, tenant="a", admin=True).key
        done = jobs.create(
            session=session,
            jobs=[jobs.NewJob(model="m", version=1, samples=1, inputs=b"x") for _ in range(200)],
        )
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[j.id for j in done], owner="b", lease_s=60)
        now = clock.now(session)
        session.execute(
            update(Job)
            .where(Job.id.in_([j.id for j in done]))
            .values(started_at=now - timedelta(seconds=20))
        )
        out = tensors.pack({"y": np.zeros((1, 2), np.float32)})
        jobs.complete(session=session, results=[(lease, out) for lease in leases], now=now)
    last = ""
    for start in range(0, count, 4000):
        with sessions.begin() as session:
            made = jobs.create(
                session=session,
                jobs=[
                    jobs.NewJob(
                        model="m",
                        version=1,
                        samples=1,
                        inputs=b"x",
                        tenant="abc"[i % 3],
                        priority=i % 3,
                    )
                    for i in range(start, min(start + 4000, count))
                ],
            )
            last = made[-10].id
    engine.dispose()
    return key, last, done[0].id


async def _time(client: httpx.AsyncClient, path: str, runs: int) -> tuple[float, dict]:
    for _ in range(20):
        answer = await client.get(path)
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        answer = await client.get(path)
        took.append(time.perf_counter() - started)
    answer.raise_for_status()
    return statistics.median(took) * 1000, answer.json()


async def _bench(url: str, redis_url: str, key: str, queued: str, finished: str) -> None:
    app = create_app(Settings(database_url=url, broker_url=redis_url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://tffleet",
            headers={"Authorization": f"Bearer {key}"},
        ) as client:
            ms, job = await _time(client, f"/v1/jobs/{queued}", 300)
            shown = {k: job.get(k) for k in ("status", "queue_position", "eta_s")}
            print(f"  GET a queued job          {ms:7.2f} ms  {shown}")
            ms, job = await _time(client, f"/v1/jobs/{finished}", 300)
            print(f"  GET a finished job        {ms:7.2f} ms")
            ms, page = await _time(client, "/v1/jobs?status=queued&limit=100", 50)
            positions = [j.get("queue_position") for j in page["jobs"]]
            print(f"  GET 100 queued (a list)   {ms:7.2f} ms  first positions {positions[:3]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="PostgreSQL; default: SQLite")
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args(argv)
    with scratch_database(args.database_url or "sqlite://") as url, _redis() as redis_url:
        key, queued, finished = _fill(url, args.jobs)
        print(f"{args.jobs} queued jobs ({make_url(url).get_backend_name()}), median:")
        asyncio.run(_bench(url, redis_url, key, queued, finished))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
