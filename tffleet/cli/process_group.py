"""Child processes that die with their parent: what `tffleet up` starts and stops."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux only: if `tffleet up` is killed outright, the kernel sends its children SIGTERM.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout_s:.0f}s")


@dataclass
class ProcessGroup:
    """Processes started in order and stopped in reverse order, politely then firmly."""

    stop_timeout_s: float = 20.0
    started: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    # How each was started, so that `restart` starts it the same way (same port, same password).
    _how: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)

    def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        self._how[name] = (list(argv), dict(env or {}))
        proc = self._spawn(name)
        self.started.append((name, proc))
        return proc

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """`name` started again as it was first, in its place: stopped in the same order."""
        proc = self._spawn(name)
        self.started = [(n, proc if n == name else p) for n, p in self.started]
        return proc

    def _spawn(self, name: str) -> subprocess.Popen[bytes]:
        argv, env = self._how[name]
        return subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            # Own session: Ctrl-C reaches only `tffleet up`, which then stops each in order.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def first_exited(self) -> tuple[str, int] | None:
        for name, proc in self.started:
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    def stop(self) -> None:
        for _, proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.started.clear()
