"""`tffleet up` keeps its processes running: one that exits is started again, with a back-off.

A SIGTERM to the worker drains it (docs/how-to/scale-out.md) and it exits 0; under `up` that is
how one process is restarted alone, so an exit, clean or not, never stops the others. Only Ctrl-C
or SIGTERM to `up` itself does (tffleet/cli/up.py).

Redis too: it is private to this run and keeps nothing (no snapshot, no AOF), and every other
process reaches it by the port and password in its environment, so it comes back on the same
port with the same config file. The wake-ups it held are lost, which costs time, never a job: the
sweeper republishes queued jobs whose wake-up is older than TFFLEET_REPUBLISH_AFTER_S, and the
worker, API and sweeper reconnect by themselves (tests/e2e/test_faults_broker.py).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TextIO

from tffleet.cli.process_group import ProcessGroup

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
# A process that stayed up this long is healthy again: its next exit waits FIRST_DELAY_S only.
STABLE_AFTER_S = 60.0


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class _Watched:
    up_since: float
    delay_s: float = FIRST_DELAY_S
    due_at: float | None = None  # when it starts again; None while it runs


@dataclass
class Supervisor:
    group: ProcessGroup
    clock: Callable[[], float] = time.monotonic
    out: TextIO = field(default_factory=lambda: sys.stderr)
    _watched: dict[str, _Watched] = field(default_factory=dict)

    def step(self) -> None:
        """Notice the processes that exited, and start again those whose back-off is over."""
        now = self.clock()
        for name, proc in list(self.group.started):
            watched = self._watched.setdefault(name, _Watched(up_since=now))
            if watched.due_at is not None:
                if now >= watched.due_at:
                    new = self.group.restart(name)
                    watched.up_since, watched.due_at = now, None
                    self._say(f"{name} started again (pid {new.pid})")
                continue
            code = proc.poll()
            if code is None:
                continue
            if now - watched.up_since >= STABLE_AFTER_S:
                watched.delay_s = FIRST_DELAY_S
            watched.due_at = now + watched.delay_s
            how = (
                f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
            )
            self._say(
                f"{name} (pid {proc.pid}) {how}; starting it again in {watched.delay_s:.0f} s"
            )
            watched.delay_s = min(watched.delay_s * 2, MAX_DELAY_S)

    def run(self, *, poll_s: float = 0.5) -> None:
        """Until interrupted (KeyboardInterrupt: Ctrl-C, or SIGTERM to `up`)."""
        while True:
            self.step()
            time.sleep(poll_s)

    def _say(self, line: str) -> None:
        print(f"tffleet: {datetime.now():%H:%M:%S} {line}", file=self.out, flush=True)
