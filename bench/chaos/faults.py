"""The chaos run's fleet, its supervisor and its faults.

The fleet is tests/e2e/hosts.py's Cluster: an API host, a sweeper host and two worker hosts
(network namespaces as root, else process groups), one Redis on the bridge, PostgreSQL through
a forwarder. A supervisor thread restarts whatever exited, as `tffleet up` or a service manager
would. `Faults.inject` hits the fleet with one fault and records what it hit: the jobs running
on the victim at that moment (its "victims": the only jobs allowed to end `worker_lost`).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text

from bench.chaos.postgres import RestartablePostgres
from tests.e2e.hosts import Cluster, Host, JobsTable

KINDS = ("child", "worker", "api", "sweeper", "stop", "redis", "postgres", "netcut")
SERVICES = (("api", "api"), ("sweeper", "sweeper"), ("w1", "worker"), ("w2", "worker"))
DEVICES = "cpu:1"


@dataclass
class Fault:
    kind: str
    target: str
    at: float  # time.time() when it hit
    over_at: float = 0.0  # when the fleet had what it lost back (restarted, resumed, reconnected)
    victims: set[str] = field(default_factory=set)
    detail: str = ""
    active_at: float | None = None  # a sweeper killed: when a sweeper was active again (its log)


class Fleet:
    """The cluster's processes, kept running by a supervisor thread."""

    def __init__(self, cluster: Cluster, table: JobsTable) -> None:
        self.cluster, self.table = cluster, table
        self.groups: set[int] = set()  # every process group started: the end kills them all
        self.restarts: list[tuple[float, str, str, int | None]] = []  # at, host, name, rc
        self.expected: set[tuple[str, str]] = set()  # killed on purpose, not yet restarted
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def host(self, name: str) -> Host:
        return self.cluster.hosts[name]

    def start(self) -> None:
        c = self.cluster
        api, sweeper = c.add_host("api"), c.add_host("sweeper")
        w1, w2 = c.add_host("w1"), c.add_host("w2")
        c.start_api(api)
        c.start_sweeper(sweeper)
        c.start_worker(w1, DEVICES)
        c.start_worker(w2, DEVICES)
        c.wait_workers(w1, 1, timeout_s=240)
        c.wait_workers(w2, 1, timeout_s=240)
        self._note_groups()
        self._thread.start()

    def _note_groups(self) -> None:
        for host in self.cluster.hosts.values():
            self.groups.update(proc.pid for proc in host.procs.values())

    def _start(self, host: Host, name: str) -> None:
        if name == "worker":
            self.cluster.start_worker(host, DEVICES)
        else:
            self.cluster.tffleet(host, name, name)
        self._note_groups()

    def _supervise(self) -> None:
        while not self._stop.wait(0.3):
            with self._lock:
                for host_name, name in SERVICES:
                    proc = self.host(host_name).procs[name]
                    if proc.poll() is None:
                        continue
                    planned = (host_name, name) in self.expected
                    self.expected.discard((host_name, name))
                    self.restarts.append(
                        (time.time(), host_name, name, None if planned else proc.returncode)
                    )
                    self._start(self.host(host_name), name)

    def note_sweeper_active(self, faults: list[Fault]) -> None:
        """Each sweeper fault's `active_at`: the first "this is the active sweeper" line its
        sweeper host logged after it (the new process waits for the dead one's Redis lock)."""
        lines = re.findall(
            r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO worker\.sweeper: this is the active",
            self.host("sweeper").log("sweeper"),
            re.MULTILINE,
        )
        stamps = [datetime.strptime(line, "%Y-%m-%d %H:%M:%S,%f").timestamp() for line in lines]
        for fault in faults:
            if fault.kind == "sweeper":
                fault.active_at = min((t for t in stamps if t > fault.at), default=None)

    def unplanned_exits(self) -> list[str]:
        return [f"{h} {n} exited {rc}" for _, h, n, rc in self.restarts if rc is not None]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        # The history is checked: nothing is left to drain. SIGKILL every group ever started (a
        # worker's main process killed alone may have left its children in its group).
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self.cluster.close()

    def kill_group(self, host: Host, name: str, *, whole: bool) -> None:
        with self._lock:
            self.expected.add((host.name, name))
            proc = host.procs[name]
            with contextlib.suppress(ProcessLookupError):
                if whole:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    os.kill(proc.pid, signal.SIGKILL)

    def wait_restarted(self, host: Host, name: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if (host.name, name) not in self.expected and host.procs[name].poll() is None:
                    return
            time.sleep(0.1)

    # What runs where

    def running(self, host: Host, pid: int | None = None) -> set[str]:
        """Jobs running on `host` (on child `pid`), with the jobs split into them."""
        try:
            with self.table.engine.connect() as conn:
                rows = conn.execute(
                    text("SELECT id, parent_id, worker FROM jobs WHERE status = 'running'")
                ).all()
        except Exception:  # PostgreSQL away: the victims are unknown
            return set()
        found: set[str] = set()
        for row in rows:
            if self.cluster.host_of(row.worker) != host.name:
                continue
            if pid is not None and row.worker.split("/")[1] != str(pid):
                continue
            found.add(row.id)
            if row.parent_id:
                found.add(row.parent_id)
        return found


class Faults:
    def __init__(
        self,
        fleet: Fleet,
        postgres: RestartablePostgres | None,
        *,
        lease_s: float,
        rng: random.Random,
    ) -> None:
        self.fleet, self.postgres, self.lease_s, self.rng = fleet, postgres, lease_s, rng
        self.kinds = [k for k in KINDS if self.available(k)]
        self.first_host: dict[str, int] = {}
        self.hits: dict[str, int] = {}

    def available(self, kind: str) -> bool:
        if kind == "postgres":
            return self.postgres is not None
        if kind == "netcut":
            return self.fleet.cluster.bridge is not None
        return True

    def inject(self, kind: str) -> Fault:
        fleet = self.fleet
        # Each kind hits the two worker hosts in turn, from one the seed picks.
        first = self.first_host.setdefault(kind, self.rng.randrange(2))
        self.hits[kind] = self.hits.get(kind, 0) + 1
        worker_host = fleet.host(("w1", "w2")[(first + self.hits[kind]) % 2])
        at = time.time()
        if kind == "child":
            children = [r for r in fleet.cluster.presence(worker_host) if r.state == "loaded"]
            alive = [r for r in children if _alive(int(r.pid))]
            if not alive:
                return Fault(kind, worker_host.name, at, time.time(), detail="no child alive")
            pid = int(self.rng.choice(alive).pid)
            victims = fleet.running(worker_host, pid)
            at = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return Fault(kind, worker_host.name, at, at, victims, f"child {pid}")
        if kind == "worker":
            victims = fleet.running(worker_host)
            at = time.time()
            fleet.kill_group(worker_host, "worker", whole=False)
            fleet.wait_restarted(worker_host, "worker")
            return Fault(kind, worker_host.name, at, time.time(), victims, "main process")
        if kind in ("api", "sweeper"):
            at = time.time()
            fleet.kill_group(fleet.host(kind), kind, whole=True)
            fleet.wait_restarted(fleet.host(kind), kind)
            return Fault(kind, kind, at, time.time())
        if kind == "stop":
            hold_s = self.lease_s + self.rng.uniform(2, 5)
            victims = fleet.running(worker_host)
            at = time.time()
            worker_host.signal(signal.SIGSTOP)
            time.sleep(hold_s)
            worker_host.signal(signal.SIGCONT)
            return Fault(kind, worker_host.name, at, time.time(), victims, f"{hold_s:.1f}s")
        if kind == "redis":
            fleet.cluster.redis.restart()
            return Fault(kind, "redis", at, time.time())
        if kind == "postgres":
            assert self.postgres is not None
            self.postgres.restart()
            return Fault(kind, "postgres", at, time.time())
        if kind == "netcut":
            hold_s = self.rng.uniform(3, self.lease_s + 4)
            victims = fleet.running(worker_host)
            at = time.time()
            _link(worker_host, "down")
            time.sleep(hold_s)
            _link(worker_host, "up")
            return Fault(kind, worker_host.name, at, time.time(), victims, f"{hold_s:.1f}s")
        raise ValueError(kind)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _link(host: Host, state: str) -> None:
    """Every link but loopback in `host`'s namespace, down or up."""
    assert host.netns is not None
    listed = subprocess.run(
        ["ip", "-n", host.netns, "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    for line in listed.splitlines():
        device = line.split(":")[1].strip().split("@")[0]
        if device != "lo":
            subprocess.run(["ip", "-n", host.netns, "link", "set", device, state], check=True)
    if state == "up":  # the default route went with the link
        gateway = host.address.rsplit(".", 1)[0] + ".1"
        subprocess.run(
            ["ip", "-n", host.netns, "route", "replace", "default", "via", gateway], check=True
        )
