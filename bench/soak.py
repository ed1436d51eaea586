"""A soak: the fleet under half of its measured capacity for a long time, watched for leaks.

    .venv/bin/python -m bench.soak [--minutes 60] [--rate JOBS_PER_S] [--database-url URL]

It starts a fleet as `bench.run` does (a private Redis, SQLite in a temporary directory or
`--database-url`, `tffleet api`, a worker `cpu:1`, and `tffleet sweeper`), measures its capacity
for `--capacity-s` with the lean HTTP client of bench/rawhttp.py (one-sample `mlp` jobs, each a
`POST /v1/jobs?wait=30`), unless `--rate` is given, then sends half of that, paced, for
`--minutes`. Every `--sample-s` it samples each process's RSS (/proc/PID/status VmRSS; the
worker's children each on their own, by role) and open descriptors (/proc/PID/fd), the database's
connections (PostgreSQL: pg_stat_activity; SQLite has none), Redis's memory (INFO memory) and the
SQLite file's size (with its -wal). It prints a table per minute (jobs, errors, latency p50/p99
from send to answer, the samples), the growth over the run, and exits 1 on a leak:

- a process's RSS still rising over the last half: the Theil-Sen slope of its samples there
  (the median of every pair's slope, so a few allocator steps do not move it) above
  `--rss-tolerance` MB a minute;
- its descriptors still rising there (slope above `--fd-tolerance` a minute);
- the p99 of the last minute above 2x that of the first.

The load client shares the cores with the fleet, so it prints its own CPU per job.

`TFFLEET_SOAK_TRACE=DIR` (bench only) puts bench/soak_trace/ on the fleet's PYTHONPATH: every
Python process of it (the worker's forked children too) then writes, every
`TFFLEET_SOAK_TRACE_S` (60) seconds, `DIR/PID-N.txt`: its gc objects counted by type, and with
`TFFLEET_SOAK_TRACEMALLOC=1` the top tracemalloc differences since its first snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench import run
from bench.rawhttp import Connection
from tffleet.cli.process_group import ProcessGroup

PAGE_MB = 1 / 1024  # VmRSS is in kB


# Sampling


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc/*/stat."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def processes(roots: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Role -> pid for each root and its descendants: `worker`, `worker.1` (its first child),
    `worker.1.1` ..., numbered in pid order so that a role keeps its name between samples."""
    tree = _children()
    found: dict[str, int] = {}

    def walk(role: str, pid: int) -> None:
        found[role] = pid
        for i, child in enumerate(sorted(tree.get(pid, [])), 1):
            walk(f"{role}.{i}", child)

    for role, pid in roots:
        walk(role, pid)
    return found


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * PAGE_MB
    return 0.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Sample:
    t: float  # seconds since the soak began
    rss: dict[str, float]  # role -> MB
    fds: dict[str, int]
    redis_mb: float
    db_connections: int | None
    db_mb: float | None


class Sampler:
    def __init__(self, roots: Sequence[tuple[str, int]], redis_port: int, database_url: str):
        import redis

        self.roots = roots
        self.redis = redis.Redis(port=redis_port)
        self.database_url = database_url
        self.engine = None
        if database_url.startswith("postgresql"):
            from sqlalchemy import create_engine

            self.engine = create_engine(database_url, pool_size=1)
        self.sqlite = (
            Path(database_url.removeprefix("sqlite:///"))
            if database_url.startswith("sqlite")
            else None
        )

    def sample(self, t: float) -> Sample:
        rss, open_fds = {}, {}
        for role, pid in processes(self.roots).items():
            try:
                rss[role], open_fds[role] = rss_mb(pid), fds(pid)
            except OSError:  # ended between the walk and the read
                continue
        connections = None
        if self.engine is not None:
            from sqlalchemy import text

            with self.engine.connect() as conn:
                connections = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalar_one()
        db_mb = None
        if self.sqlite is not None:
            db_mb = (
                sum(
                    p.stat().st_size
                    for p in (self.sqlite, Path(f"{self.sqlite}-wal"))
                    if p.exists()
                )
                / 2**20
            )
        redis_mb = int(self.redis.info("memory")["used_memory"]) / 2**20
        return Sample(t, rss, open_fds, redis_mb, connections, db_mb)


# Load


@dataclass
class Minute:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0

    def p(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


FIRST_ERROR: list[str] = []  # the first failed answer, printed at the end


async def _once(conn: Connection, raw: bytes) -> bool:
    response = await conn.request(raw)
    if response.status < 300 and orjson.loads(response.body).get("status") == "succeeded":
        return True
    if not FIRST_ERROR:
        FIRST_ERROR.append(f"{response.status} {response.body[:300]!r}")
    return False


async def capacity(fleet: run.Fleet, body: bytes, *, seconds: float, clients: int) -> float:
    """Jobs a second that `clients` connections, each one job at a time, get through."""
    conns = [await fleet.connect() for _ in range(clients)]
    raws = [c.post_bytes("/v1/jobs?wait=30", body) for c in conns]
    for conn, raw in zip(conns, raws, strict=True):  # warm
        await _once(conn, raw)
    done, deadline = 0, time.perf_counter() + seconds

    async def client(conn: Connection, raw: bytes) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await _once(conn, raw)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c, r) for c, r in zip(conns, raws, strict=True)))
    rate = done / (time.perf_counter() - started)
    for conn in conns:
        await conn.close()
    return rate


async def paced(
    fleet: run.Fleet, body: bytes, *, rate: float, seconds: float, clients: int
) -> tuple[list[Minute], float]:
    """`rate` jobs a second for `seconds`, each sent at its slot by the first free connection;
    latencies by the minute they ended in. Returns the minutes and the client's CPU per job."""
    conns = [await fleet.connect() for _ in range(clients)]
    raws = [c.post_bytes("/v1/jobs?wait=30", body) for c in conns]
    minutes = [Minute() for _ in range(int(seconds // 60) + 1)]
    slot = 0
    start = time.perf_counter()
    end = start + seconds
    cpu = time.process_time()
    sent = 0

    async def client(conn: Connection, raw: bytes) -> None:
        nonlocal slot, sent
        while True:
            at = start + slot / rate
            slot += 1
            if at >= end or time.perf_counter() >= end:
                return
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            began = time.perf_counter()
            try:
                ok = await _once(conn, raw)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                ok = False
                FIRST_ERROR[:0] = [] if FIRST_ERROR else [repr(exc)]
                conn = await fleet.connect()  # this one is broken
                raw = conn.post_bytes("/v1/jobs?wait=30", body)
                conns.append(conn)
            finished = time.perf_counter()
            minute = minutes[min(len(minutes) - 1, int((finished - start) // 60))]
            sent += 1
            if ok:
                minute.latencies.append(finished - began)
            else:
                minute.errors += 1

    await asyncio.gather(*(client(c, r) for c, r in zip(conns, raws, strict=True)))
    cpu = time.process_time() - cpu
    for conn in conns:
        await conn.close()
    full = int(seconds // 60) or 1
    return minutes[:full], cpu / max(sent, 1) * 1000


# Verdict


def theil_sen(points: Sequence[tuple[float, float]]) -> float:
    """The median of the slopes of every pair of points (x apart): robust to a few outliers."""
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    ]
    return statistics.median(slopes) if slopes else 0.0


def growth(samples: Sequence[Sample], key: str, role: str) -> tuple[float, float, float]:
    """First value, last value and the last half's slope per minute of `role`'s `key`."""
    values = [(s.t / 60, getattr(s, key)[role]) for s in samples if role in getattr(s, key)]
    if not values:
        return float("nan"), float("nan"), 0.0
    half = [p for p in values if p[0] >= values[-1][0] / 2]
    return values[0][1], values[-1][1], theil_sen(half)


def report(
    samples: Sequence[Sample], minutes: Sequence[Minute], args: argparse.Namespace
) -> list[str]:
    """Print the table and the growth; return the leaks found."""
    roles = sorted({r for s in samples for r in s.rss})
    print("\nmin   jobs  err   p50 ms   p99 ms  " + "  ".join(f"{r:>9}" for r in roles)
          + "  redis MB  db MB  db conns")  # fmt: skip
    for i, minute in enumerate(minutes):
        inside = [s for s in samples if i * 60 <= s.t < (i + 1) * 60] or samples[-1:]
        last = inside[-1]
        cells = "  ".join(f"{last.rss.get(r, float('nan')):6.0f}/{last.fds.get(r, 0):<2d}"
                          for r in roles)  # fmt: skip
        db_mb = "-" if last.db_mb is None else f"{last.db_mb:.1f}"
        conns = "-" if last.db_connections is None else str(last.db_connections)
        head = f"{i + 1:3d} {len(minute.latencies):6d} {minute.errors:4d}"
        print(f"{head} {minute.p(0.5):8.1f} {minute.p(0.99):8.1f}  {cells}  "
              f"{last.redis_mb:8.1f}  {db_mb:>5}  {conns:>8}")  # fmt: skip
    print("(each process: RSS MB / open descriptors, at the minute's last sample)")

    leaks = []
    print("\ngrowth          RSS first -> last MB   last half MB/min   fds first -> last   "
          "last half fds/min")  # fmt: skip
    for role in roles:
        r0, r1, rslope = growth(samples, "rss", role)
        f0, f1, fslope = growth(samples, "fds", role)
        print(f"{role:14s} {r0:8.1f} -> {r1:8.1f}   {rslope:+16.2f}   {f0:5.0f} -> {f1:5.0f}   "
              f"{fslope:+17.2f}")  # fmt: skip
        if rslope > args.rss_tolerance:
            leaks.append(f"{role}: RSS still rising over the last half, {rslope:+.2f} MB/min "
                         f"(tolerance {args.rss_tolerance})")  # fmt: skip
        if fslope > args.fd_tolerance:
            leaks.append(f"{role}: descriptors still rising over the last half, "
                         f"{fslope:+.2f}/min (tolerance {args.fd_tolerance})")  # fmt: skip
    first, last = samples[0], samples[-1]
    print(f"redis          {first.redis_mb:8.1f} -> {last.redis_mb:8.1f} MB")
    if first.db_mb is not None and last.db_mb is not None:
        span = max((last.t - first.t) / 60, 1e-9)
        jobs = max(sum(len(m.latencies) + m.errors for m in minutes), 1)
        print(f"sqlite file    {first.db_mb:8.1f} -> {last.db_mb:8.1f} MB "
              f"({(last.db_mb - first.db_mb) / span:+.1f} MB/min, "
              f"{(last.db_mb - first.db_mb) * 2**20 / jobs:.0f} bytes a job)")  # fmt: skip
    if minutes:
        p_first, p_last = minutes[0].p(0.99), minutes[-1].p(0.99)
        if p_last > 2 * p_first:
            leaks.append(
                f"p99 of the last minute {p_last:.1f} ms > 2x the first's {p_first:.1f} ms"
            )
    return leaks


# The run


def _trace_env() -> dict[str, str]:
    """The fleet's PYTHONPATH with bench/soak_trace/ first, when TFFLEET_SOAK_TRACE is set."""
    if not os.environ.get("TFFLEET_SOAK_TRACE"):
        return {}
    here = Path(__file__).resolve().parent
    path = [str(here / "soak_trace"), str(here.parent), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, help="jobs/s (default: half of measured capacity)")
    parser.add_argument("--capacity-s", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=16, help="connections")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--rss-tolerance", type=float, default=1.0, help="MB/min, last half")
    parser.add_argument("--fd-tolerance", type=float, default=0.5, help="per min, last half")
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # this process is the client
    with tempfile.TemporaryDirectory(prefix="tffleet-soak-") as tmp:
        work = Path(tmp)
        repository = work / "models"
        run.build_models(repository)
        group = ProcessGroup()
        try:
            port = run.start_redis(group, tmp)
            database_url = args.database_url or f"sqlite:///{work / 'tffleet.db'}"
            os.environ.update(_trace_env())
            fleet = run.start_fleet(
                group, repository, f"redis://127.0.0.1:{port}/0", database_url, "cpu:1"
            )
            body = run.one_sample_body("mlp")
            rate = args.rate
            if rate is not None:  # no capacity run: let the sweeper start before the samples
                time.sleep(10)
            if rate is None:
                measured = asyncio.run(
                    capacity(fleet, body, seconds=args.capacity_s, clients=args.clients)
                )
                rate = measured / 2
                print(f"capacity {measured:.0f} jobs/s over {args.capacity_s:.0f} s; "
                      f"soaking at {rate:.0f} jobs/s")  # fmt: skip
            roots = [(name, proc.pid) for name, proc in group.started]
            sampler = Sampler(roots, port, database_url)
            samples: list[Sample] = []
            stop = threading.Event()
            began = time.perf_counter()

            def sample_loop() -> None:
                while not stop.is_set():
                    samples.append(sampler.sample(time.perf_counter() - began))
                    stop.wait(args.sample_s)

            thread = threading.Thread(target=sample_loop, daemon=True)
            thread.start()
            minutes, cpu_ms = asyncio.run(
                paced(fleet, body, rate=rate, seconds=args.minutes * 60, clients=args.clients)
            )
            stop.set()
            thread.join()
            exited = group.first_exited()
        finally:
            group.stop()
    jobs = sum(len(m.latencies) for m in minutes)
    errors = sum(m.errors for m in minutes)
    print(f"\n{jobs} jobs, {errors} errors, {jobs / (args.minutes * 60):.0f} jobs/s "
          f"(asked {rate:.0f}); load client CPU {cpu_ms:.2f} ms/job")  # fmt: skip
    leaks = report(samples, minutes, args)
    if exited is not None:
        leaks.append(f"{exited[0]} exited with status {exited[1]} during the soak")
    if errors:
        leaks.append(f"{errors} jobs failed, the first: {FIRST_ERROR[:1]}")
    for leak in leaks:
        print(f"FAIL {leak}")
    print("PASS" if not leaks else "")
    return 1 if leaks else 0


if __name__ == "__main__":
    raise SystemExit(main())
