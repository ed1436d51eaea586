"""A worker's main process takes back the jobs of a child that died, in a second, not a lease.

Celery's prefork main process outlives its children: when one is killed (the OOM killer, a crash
in a kernel, SIGKILL) billiard starts another, but the jobs the dead one had claimed would stay
`running` until their lease expired (TFFLEET_LEASE_S). The main process knows better: it watches
its own children's pids and, when one disappears, hands that child's leases back at once
(`jobs.take_back_from`: `queued` again, or `worker_lost` once a job used its attempts) and wakes
their queue. A child's lease owner starts with `owner_prefix(host, pid)`, which is how its jobs
are found. A whole host that dies has nobody left to do this: its leases expire instead.

This runs in the Celery main process: no TensorFlow here.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from db import jobs

log = logging.getLogger(__name__)

# How often the main process looks at its children: the wait before a dead child's jobs move.
POLL_S = 0.5


def owner_prefix(host: str, pid: int) -> str:
    """How every lease owner id of the child `pid` on `host` starts (worker/child.py)."""
    return f"{host}/{pid}/"


def own_children(proc: Path = Path("/proc")) -> set[int] | None:
    """The pids of this process's living children (Linux); None where /proc cannot tell.

    A child that died stays listed, a zombie, until billiard reaps it (up to a second or so
    later): it does not count as living."""
    try:
        listed: set[int] = set()
        for task in (proc / "self" / "task").iterdir():
            listed.update(int(pid) for pid in (task / "children").read_text().split())
    except OSError:  # not Linux, or a kernel without CONFIG_PROC_CHILDREN
        return None
    return {pid for pid in listed if _alive(proc / str(pid) / "stat")}


def _alive(stat: Path) -> bool:
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]  # the field after "(comm)"
    except (OSError, IndexError):
        return False  # reaped in the meantime
    return state not in ("Z", "X")


class OrphanWatcher:
    """Watches this process's children; hands back the leases of each one that goes."""

    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        host: str,
        max_attempts: int,
        wake: Callable[[str, int, Sequence[str]], object],
        announce: Callable[[Sequence[str]], object],
        children: Callable[[], Iterable[int] | None] = own_children,
        poll_s: float = POLL_S,
    ) -> None:
        self._sessions = sessions
        self._host = host
        self._max_attempts = max_attempts
        self._wake = wake
        self._announce = announce
        self._children = children
        self._poll_s = poll_s
        self._known: set[int] = set()
        self._pending: set[int] = set()  # dead children whose jobs are not handed back yet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Watch from a daemon thread; False (and a log line) where children cannot be seen."""
        if self._children() is None:
            log.warning(
                "cannot list this process's children here (no /proc): a dead child's jobs wait "
                "for their lease to expire"
            )
            return False
        self._thread = threading.Thread(target=self._run, name="orphan-watcher", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check()
            except Exception:  # the database or Redis is away: the pending pids wait
                log.exception("could not hand back a dead child's jobs; will retry")

    def check(self) -> list[int]:
        """One look: the children that died since the last one, once their jobs are handed back."""
        now = set(self._children() or ())
        self._pending |= self._known - now
        self._known = now
        handled = []
        for pid in sorted(self._pending):
            self._take_back(pid)
            self._pending.discard(pid)
            handled.append(pid)
        return handled

    def _take_back(self, pid: int) -> None:
        prefix = owner_prefix(self._host, pid)
        while True:
            with self._sessions.begin() as session:
                back = jobs.take_back_from(
                    session=session, owner_prefix=prefix, max_attempts=self._max_attempts
                )
            if not back.count:
                return
            log.warning(
                "child %d died holding %d jobs: %d queued again, %d failed worker_lost",
                pid, back.count, back.count - len(back.failed), len(back.failed),
            )  # fmt: skip
            if back.failed:
                self._announce(back.failed)
            # Committed first: a lost wake-up leaves them queued, and the sweeper republishes.
            for (model, version), ids in back.requeued.items():
                self._wake(model, version, ids)


def start_in_this_process() -> OrphanWatcher | None:
    """Start watching the children of this (the Celery main) process, from the settings."""
    import socket

    from db.engine import make_engine, make_sessionmaker
    from tffleet.broker import PUBLISH_SOCKET_TIMEOUT_S, Publisher, make_celery
    from tffleet.settings import get_settings
    from worker.announcer import Announcer

    settings = get_settings()
    engine = make_engine(settings.database_url, pool_size=1)
    # Children are forked from this process; a child must never close this process's connection.
    os.register_at_fork(after_in_child=lambda: engine.dispose(close=False))
    publisher = Publisher(make_celery(settings, socket_timeout_s=PUBLISH_SOCKET_TIMEOUT_S))

    def wake(model: str, version: int, job_ids: Sequence[str]) -> None:
        # A message each: a job that was running when its child died runs alone (it may be what
        # killed it), so one message would run them one after another on a single child.
        for job_id in job_ids:
            publisher.publish(model=model, version=version, job_ids=[job_id], retry=True)

    watcher = OrphanWatcher(
        sessions=make_sessionmaker(engine),
        host=socket.gethostname(),
        max_attempts=settings.max_attempts,
        wake=wake,
        # Bare ids (this process holds no key): a long-poll reads the jobs from the database.
        announce=Announcer.connect(settings.broker_url),
    )
    return watcher if watcher.start() else None
