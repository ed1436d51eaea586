"""How soon a dead worker's jobs run again: a child killed alone, and a whole host killed.

    .venv/bin/python -m bench.recovery                 # about two minutes on two cores
    .venv/bin/python -m bench.recovery --rounds 1      # one kill of each kind

Two workers ("hosts": separate process groups, two children each), a sweeper and the API run on
this machine against PostgreSQL (`--database-url`, default the local `test` server, in a database
of the bench's own) and a private Redis, with the default TFFLEET_LEASE_S and
TFFLEET_SWEEP_INTERVAL_S. A model that holds its device for `--device-s` per batch keeps every
child busy with a backlog. Then:

- child: SIGKILL one child in the middle of a batch. Its worker's main process sees it die and
  hands its jobs back (worker/orphans.py); another child claims them.
- host: SIGKILL one worker's whole process group while it runs batches. Nobody is left to hand its
  jobs back: their leases expire and the sweeper requeues them for the other worker.

For each kill it prints when the dead one's jobs were back in the queue and when every one of
them was running again (claimed by another child) or done, in seconds from the kill.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import Engine, create_engine, text

from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port
from tffleet.settings import Settings

DATABASE = "tffleet_bench_recovery"


def build_model(repository: Path, *, device_s: float, max_batch_size: int) -> None:
    """`slow`: y = 2x for x of 4 floats; every forward pass waits `device_s` without a CPU."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops.testing import sleep

    class Slow(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            # The sleep dataset sleeps before its element and before its end: half each.
            waited = (
                tf.data.Dataset.from_tensors(x)
                .apply(sleep(int(device_s * 5e5)))
                .get_single_element()
            )
            return {"y": waited * 2.0}

    module = Slow()
    tf.saved_model.save(
        module, str(repository / "slow" / "1"), signatures={"serving_default": module.serve}
    )
    (repository / "slow" / "model.toml").write_text(
        f"max_batch_size = {max_batch_size}\nmax_queue_delay_ms = 0\n"
    )


class Bench:
    def __init__(self, work: Path, database_url: str, args: argparse.Namespace) -> None:
        self.group = ProcessGroup()
        self.args = args
        self.logs = work / "logs"
        self.logs.mkdir()
        self.env: dict[str, str] = {}
        redis_port = free_port()
        self._start(
            "redis",
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(work)],
        )  # fmt: skip
        wait_for_port(redis_port, timeout_s=10)
        self.api_port = free_port()
        self.env = {
            "TFFLEET_DATABASE_URL": database_url,
            "TFFLEET_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
            "TFFLEET_MODEL_REPOSITORY": str(work / "models"),
            "TFFLEET_API_PORT": str(self.api_port),
            "TFFLEET_WORKER_METRICS_PORT": "0",
            "TFFLEET_DEVICES": "cpu:2",
            "TF_CPP_MIN_LOG_LEVEL": "3",
        }
        self.engine: Engine = create_engine(database_url)
        cli = [sys.executable, "-m", "tffleet.cli"]
        if subprocess.run([*cli, "migrate"], env={**os.environ, **self.env}).returncode:
            raise RuntimeError("tffleet migrate failed")
        self.key = subprocess.run(
            [*cli, "keys", "create", "--tenant", "bench", "--admin"],
            env={**os.environ, **self.env}, capture_output=True, text=True, check=True,
        ).stdout.split()[-1]  # fmt: skip
        self._start("api", [*cli, "api", "--log-level", "warning"])
        self._start("sweeper", [*cli, "sweeper"])
        wait_for_port(self.api_port, timeout_s=60)
        self.hosts: dict[str, subprocess.Popen[bytes]] = {}
        self.generation = 0

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start in a process group of its own, its output to logs/<name>.log."""
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                argv, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, start_new_session=True,
            )  # fmt: skip
        self.group.started.append((name, proc))
        return proc

    def start_host(self) -> str:
        self.generation += 1
        name = f"host{self.generation}"
        cli = [sys.executable, "-m", "tffleet.cli"]
        self.hosts[name] = self._start(name, [*cli, "worker", "--log-level", "WARNING"])
        return name

    def children(self) -> dict[int, str]:
        """Live children (pid: host name) that hold the model, from their presence rows."""
        by_pid = {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid FROM model_presence WHERE state = 'loaded' "
                    "AND seen_at > now() - interval '10 seconds'"
                )
            )
            pids = {int(row.pid) for row in rows}
        for name, proc in self.hosts.items():
            if proc.poll() is not None:
                continue
            for pid in pids:
                if _is_descendant(pid, proc.pid):
                    by_pid[pid] = name
        return by_pid

    def wait_for(self, check: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def submit(self, jobs: int) -> None:
        """A backlog, through the API, in requests of 100 jobs."""
        import httpx

        x = np.ones((1, 4), np.float32).tolist()
        with httpx.Client(
            base_url=f"http://127.0.0.1:{self.api_port}",
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=60,
        ) as client:
            for start in range(0, jobs, 100):
                body = {"jobs": [{"model": "slow", "inputs": {"x": x}}] * min(100, jobs - start)}
                r = client.post("/v1/jobs", json=body)
                r.raise_for_status()

    def running_under(self, pid: int) -> list[str]:
        with self.engine.connect() as conn:
            return list(
                conn.scalars(
                    text("SELECT id FROM jobs WHERE status = 'running' AND lease_owner LIKE :p"),
                    {"p": f"%/{pid}/%"},
                )
            )

    def timeline(
        self, ids: list[str], killed_at: float, dead: Callable[[str], bool]
    ) -> tuple[float, float, float]:
        """When, in seconds after the kill, the jobs were back in the queue, the first was
        running again (or done), and all of them were."""
        back: float | None = None
        first: float | None = None
        while True:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    text("SELECT status, lease_owner FROM jobs WHERE id = ANY(:ids)"),
                    {"ids": ids},
                ).all()
            now = time.monotonic() - killed_at
            with_the_dead = [r for r in rows if r.status == "running" and dead(r.lease_owner)]
            if back is None and not with_the_dead:
                back = now
            again = [r.status in ("running", "succeeded") for r in rows]
            if back is not None and first is None and any(again):
                first = now
            if back is not None and first is not None and all(again):
                return back, first, now
            if now > 300:
                raise TimeoutError("the dead worker's jobs did not come back")
            time.sleep(0.02)

    def close(self) -> None:
        for proc in self.hosts.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        self.group.stop()
        self.engine.dispose()


def _is_descendant(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid == ancestor:
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )
    parser.add_argument("--rounds", type=int, default=3, help="kills of each kind")
    parser.add_argument("--device-s", type=float, default=0.5, help="device time per batch")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

    admin = create_engine(args.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        conn.execute(text(f"CREATE DATABASE {DATABASE}"))
    url = admin.url.set(database=DATABASE).render_as_string(hide_password=False)
    results: dict[str, list[Kill]] = {"child": [], "host": []}
    with tempfile.TemporaryDirectory(prefix="tffleet-recovery-") as tmp:
        work = Path(tmp)
        build_model(work / "models", device_s=args.device_s, max_batch_size=4)
        bench = Bench(work, url, args)
        try:
            bench.start_host()
            bench.start_host()
            bench.wait_for(lambda: len(bench.children()) == 4, "four children ready")
            for kind in ("child", "host"):
                for _ in range(args.rounds):
                    results[kind].append(_kill_one(bench, kind))
                    if kind == "host":
                        bench.start_host()
                    bench.wait_for(lambda: len(bench.children()) == 4, "four children again")
        finally:
            bench.close()
            admin_conn = admin.connect()
            admin_conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
            admin_conn.close()
            admin.dispose()

    print()
    defaults = Settings.model_fields
    print(
        f"lease {defaults['lease_s'].default:g} s, sweep every "
        f"{defaults['sweep_interval_s'].default:g} s (the defaults); "
        f"device {args.device_s:g} s per batch of up to 4 jobs"
    )
    print("seconds from the kill until the dead one's jobs were")
    print(f"{'killed':<10}{'jobs':>6}{'back in queue':>15}{'first rerun':>13}{'all rerun':>11}")
    for kind, kills in results.items():
        for kill in kills:
            print(
                f"{kind:<10}{kill.held:>6}{kill.back:>14.2f}s{kill.first:>12.2f}s{kill.all:>10.2f}s"
            )
        if len(kills) > 1:
            median = [statistics.median(getattr(k, f) for k in kills) for f in Kill.TIMES]
            back, first, last = median
            print(f"{kind + ' p50':<16}{back:>14.2f}s{first:>12.2f}s{last:>10.2f}s")
    return 0


@dataclass
class Kill:
    held: int  # jobs the dead one was running
    back: float  # seconds from the kill until none was running under it any more,
    first: float  # until one was claimed again (or done),
    all: float  # until every one was

    TIMES = ("back", "first", "all")


def _kill_one(bench: Bench, kind: str) -> Kill:
    feeder = threading.Thread(target=bench.submit, args=(400,), daemon=True)
    feeder.start()
    feeder.join()
    victim: int | None = None
    bench.wait_for(
        lambda: any(bench.running_under(pid) for pid in bench.children()), "a batch running"
    )
    children = bench.children()
    victim = next(pid for pid in children if bench.running_under(pid))
    host = children[victim]
    if kind == "child":
        ids = bench.running_under(victim)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        prefixes = [f"/{victim}/"]
    else:
        pids = [pid for pid, name in children.items() if name == host]
        ids = [job for pid in pids for job in bench.running_under(pid)]
        os.killpg(bench.hosts[host].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        bench.hosts[host].wait()
        prefixes = [f"/{pid}/" for pid in pids]
    back, first, again = bench.timeline(
        ids, killed_at, lambda owner: any(p in (owner or "") for p in prefixes)
    )
    print(f"{kind}: {len(ids)} jobs back after {back:.2f}s, all running again after {again:.2f}s")
    # Let the backlog drain before the next kill.
    bench.wait_for(
        lambda: not bench.running_under(victim) and _queued(bench) == 0, "the backlog done"
    )
    return Kill(len(ids), back, first, again)


def _queued(bench: Bench) -> int:
    with bench.engine.connect() as conn:
        unfinished = "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"
        return int(conn.scalar(text(unfinished)) or 0)


if __name__ == "__main__":
    sys.exit(main())
