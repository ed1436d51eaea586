"""What one worker child holds of each model version, as it reports it to the database.

Each version the child has tried is in one state (`db.models.PresenceState`): loading, loaded,
draining or failed. The whole of it is written to `db.presence` on every change and every poll,
with the device's busy share per version (worker/busy.py): the API reads it to know which
versions some live child can run, the sweeper to know whose jobs to wake.

With each version goes `claimed_at`: the database's time of the last report at which the child
had taken work of it since its report before (claimed jobs of it in a task that ended, or was
running a task of it then: a long batch or a transform's shard is work, not a stall). The task
thread only notes the claim in memory (`claimed`, `working`): no write per claim, and no time of
this host's clock, which may be off (the report's time is the database's). db/backlog.py reads
it to see a fleet whose consumers are connected but take nothing (`Backlog.stalled_s`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import clock, presence
from db.models import PresenceState
from worker.busy import BusyMeter

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (model, version); version 0 stands for the model's own config


@dataclass(frozen=True)
class Held:
    """What this child has of one version, reported as a `presence.Holding`."""

    state: PresenceState
    path: Path
    since: datetime
    error: str | None = None
    # A failed version's files when it failed: it is tried again once they change.
    files: tuple[tuple[str, int, int], ...] | None = None
    # time.monotonic() when it began to drain.
    draining_since: float | None = None


def describe(exc: BaseException) -> str:
    """An error in one line, for a report and the log."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:1000]


class Holdings:
    """The versions one child holds, and their reports. Safe to use from any thread."""

    def __init__(
        self, *, child: presence.Child, sessions: sessionmaker[Session], busy: BusyMeter
    ) -> None:
        self.child = child
        self.sessions = sessions
        self.busy = busy
        self._held: dict[Key, Held] = {}
        # Guards `_held` and serializes reports (two at once would collide on PostgreSQL).
        self._lock = threading.RLock()
        self.changed = False  # since the last report
        # Its own lock: the task thread never waits on a report's database write.
        self._claims_lock = threading.Lock()
        self._claimed: dict[Key, float] = {}  # time.monotonic() of each version's last claim
        self._working: dict[Key, int] = {}  # tasks of each version running now
        self._reported = float("-inf")  # time.monotonic() when the last report began
        self._claimed_at: dict[Key, datetime] = {}  # as reported (the database's time)

    def get(self, key: Key) -> Held | None:
        with self._lock:
            return self._held.get(key)

    def __getitem__(self, key: Key) -> Held:
        with self._lock:
            return self._held[key]

    def set(self, key: Key, held: Held | None) -> None:
        with self._lock:
            if held is None:
                self._held.pop(key, None)
            else:
                self._held[key] = held
            self.changed = True

    def in_state(self, state: PresenceState) -> dict[Key, Held]:
        with self._lock:
            return {key: held for key, held in self._held.items() if held.state == state}

    def failure(self, key: Key) -> str | None:
        """Why this child could not load the version, if it tried and failed."""
        held = self.get(key)
        return held.error if held is not None and held.state == PresenceState.FAILED else None

    def claimed(self, key: Key) -> None:
        """The task thread claimed jobs of this version: the next report says so."""
        with self._claims_lock:
            self._claimed[key] = time.monotonic()

    @contextmanager
    def working(self, key: Key) -> Iterator[None]:
        """A task of this version runs in the block: every report meanwhile counts as a claim."""
        with self._claims_lock:
            self._working[key] = self._working.get(key, 0) + 1
        try:
            yield
        finally:
            with self._claims_lock:
                self._working[key] -= 1
                if not self._working[key]:
                    del self._working[key]

    def _claims_at(self, now: datetime) -> dict[Key, datetime]:
        """Each held version's `claimed_at` for a report written at `now`: `now` for those claimed
        since the last report began (or being worked), the time reported before for the rest."""
        with self._claims_lock:
            fresh = {key for key, at in self._claimed.items() if at >= self._reported}
            fresh.update(self._working)
        with self._lock:
            held = set(self._held)
        found = {key: at for key, at in self._claimed_at.items() if key in held}
        found.update((key, now) for key in fresh if key in held)
        return found

    def as_reported(
        self, claimed_at: Mapping[Key, datetime] | None = None
    ) -> list[presence.Holding]:
        claimed_at = self._claimed_at if claimed_at is None else claimed_at
        shares = self.busy.shares()
        with self._lock:
            return [
                presence.Holding(
                    name=name,
                    version=version,
                    state=held.state,
                    path=str(held.path),
                    since=held.since,
                    error=held.error,
                    busy=shares.get((name, version)) if shares else None,
                    claimed_at=claimed_at.get((name, version)),
                )
                for (name, version), held in sorted(self._held.items())
            ]

    def report(self, change: Callable[[Session], object] | None = None) -> None:
        """Write what this child holds (after `change`, in the same transaction).

        Raises SQLAlchemyError when the database fails.
        """
        with self._lock:
            # A claim noted while this report is written counts in the next one too: none is lost.
            began = time.monotonic()
            with self.sessions.begin() as session:
                if change is not None:
                    change(session)
                now = clock.now(session)
                claimed_at = self._claims_at(now)
                presence.report(
                    session=session,
                    child=self.child,
                    holdings=self.as_reported(claimed_at),
                    now=now,
                )
            self._claimed_at, self._reported = claimed_at, began
            self.changed = False

    def report_quietly(self, change: Callable[[Session], object] | None = None) -> None:
        """`report`, logging a database failure: the next poll reports again."""
        try:
            self.report(change)
        except SQLAlchemyError as exc:
            log.warning(
                "child %s could not report its models (%s); will retry",
                self.child.device, describe(exc),
            )  # fmt: skip

    def withdraw(self) -> None:
        with self._lock, self.sessions.begin() as session:
            presence.withdraw(session=session, child_id=self.child.id)
