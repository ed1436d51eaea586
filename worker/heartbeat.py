"""A child's heartbeat: keeps the leases it holds alive, and calls time on a batch that runs past
its deadline.

A child holds up to three batches at once (worker/batching.py): one being claimed and decoded,
one on the device, one being written. Every lease held is extended; only the batch on the device
has a deadline. One thread per child beats them all; starting one per batch would cost more than
a small batch's forward pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.jobs import Lease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Running:
    """The batch whose forward passes are running now."""

    model: str
    version: int
    leases: list[Lease]
    timeout_s: float | None
    deadline: float | None  # time.monotonic() after which it has run too long

    @property
    def job_ids(self) -> list[str]:
        return [lease.job_id for lease in self.leases]


class Heartbeat:
    """Extends the leases held (`keep`) and the running batch's every third of `lease_s`; at the
    running batch's deadline calls `on_deadline(batch)` instead, while the batch cannot finish
    (see `hold`)."""

    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        lease_s: float,
        on_deadline: Callable[[Running], None],
    ) -> None:
        self._sessions = sessions
        self._lease_s = lease_s
        self._on_deadline = on_deadline
        self._cond = threading.Condition()
        self._running: Running | None = None
        # The leases the child holds besides the running batch's (claimed and waiting, or being
        # written; `keep` may include the running batch's too), by job id.
        self._kept: dict[str, Lease] = {}
        self._thread: threading.Thread | None = None
        # When the thread wakes next (time.monotonic()); it re-reads `_running` then.
        self._wakes_at = 0.0

    def keep(self, leases: Sequence[Lease]) -> None:
        """Extend these leases from now on, until `drop`."""
        with self._cond:
            self._kept.update((lease.job_id, lease) for lease in leases)
            self._start()

    def drop(self, leases: Sequence[Lease]) -> None:
        with self._cond:
            for lease in leases:
                if self._kept.get(lease.job_id) is lease:
                    del self._kept[lease.job_id]

    def kept(self) -> list[Lease]:
        """The leases held through `keep`."""
        with self._cond:
            return list(self._kept.values())

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
            self._thread.start()

    @contextmanager
    def hold(
        self, *, model: str, version: int, leases: Sequence[Lease], timeout_s: float | None
    ) -> Iterator[None]:
        """Keep these leases alive while the block runs, for at most `timeout_s` seconds.

        Leaving the block waits while `on_deadline` runs for this batch: a batch that was timed
        out never gets to write its results (in a worker, the process ends first).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        running = Running(model, version, list(leases), timeout_s, deadline)
        with self._cond:
            self._running = running
            if self._thread is None:
                self._start()
            elif deadline is not None and deadline < self._wakes_at:
                # Woken only when it would sleep past this batch's deadline: waking a thread
                # for every batch costs an idle job a noticeable part of its round trip.
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                if self._running is running:
                    self._running = None

    def _beat(self) -> None:
        interval = self._lease_s / 3
        next_beat = time.monotonic() + interval
        while True:
            with self._cond:
                now = time.monotonic()
                running = self._running
                held = {lease.job_id: lease for lease in self._kept.values()}
                deadline = running.deadline if running is not None else None
                if running is not None and deadline is not None and now >= deadline:
                    self._on_deadline(running)  # holding the lock: the batch cannot finish
                    self._running = None
                    continue
                due = next_beat if deadline is None else min(next_beat, deadline)
                if now < due:
                    self._wakes_at = due
                    self._cond.wait(due - now)
                    continue
            next_beat = now + interval
            if running is not None:
                held.update((lease.job_id, lease) for lease in running.leases)
            if not held:
                continue
            try:
                with self._sessions.begin() as session:
                    jobs.heartbeat(session=session, leases=[*held.values()], lease_s=self._lease_s)
            except Exception:
                log.exception("lease heartbeat failed; will retry")
