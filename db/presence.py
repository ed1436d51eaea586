"""Which worker children hold which model versions: reported by the children, read by the API.

Each child replaces its rows every TFFLEET_MODEL_POLL_S (`report`) and removes them when it stops
cleanly (`withdraw`). A row not seen for LIVE_POLLS polls belongs to a child that died or hangs:
`live_since` draws that line, readers ignore older rows, and the sweeper deletes them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from db import clock
from db.models import ModelPresence, PresenceState

# A child that missed this many reports in a row is taken for dead.
LIVE_POLLS = 3
# The states in which a child runs a version's jobs.
HOLDING = (PresenceState.LOADED.value, PresenceState.DRAINING.value)


def live_since(poll_s: float, now: datetime) -> datetime:
    """Rows seen at or after this instant belong to live children; `now` is the database's
    (`db.clock.now`), as the rows' `seen_at` is."""
    return now - timedelta(seconds=LIVE_POLLS * poll_s)


@dataclass(frozen=True)
class Child:
    id: str  # the child's lease owner string
    host: str
    pid: int
    device: str


@dataclass(frozen=True)
class Holding:
    """What one child has of one model version."""

    name: str
    version: int
    state: PresenceState
    path: str
    since: datetime
    error: str | None = None
    busy: float | None = None  # the device's busy share running it over the last minute
    # When the child last took work of it, as of one of its reports (the database's time that
    # report wrote): the child says which versions it claimed since its last report and carries
    # the time forward (worker/holdings.py). Never the child's own clock.
    claimed_at: datetime | None = None


def report(
    *, session: Session, child: Child, holdings: Sequence[Holding], now: datetime | None = None
) -> None:
    """Replace the child's rows with `holdings`, seen now.

    Two reports of one child must not run at once (on PostgreSQL the second insert would meet
    the first one's rows): a child reports from one thread at a time.
    """
    now = now or clock.now(session)
    session.execute(delete(ModelPresence).where(ModelPresence.child == child.id))
    if holdings:
        session.execute(
            insert(ModelPresence),
            [
                {
                    "child": child.id,
                    "host": child.host,
                    "pid": child.pid,
                    "device": child.device,
                    "name": h.name,
                    "version": h.version,
                    "state": h.state.value,
                    "path": h.path,
                    "error": h.error,
                    "since": h.since,
                    "seen_at": now,
                    "busy": h.busy,
                    "claimed_at": h.claimed_at,
                }
                for h in holdings
            ],
        )


def withdraw(*, session: Session, child_id: str) -> int:
    """Remove a child's rows: it is stopping and holds nothing any more."""
    result = session.execute(delete(ModelPresence).where(ModelPresence.child == child_id))
    return int(result.rowcount)  # type: ignore[attr-defined]


def purge_dead(*, session: Session, before: datetime) -> int:
    """Delete the rows of children not heard of since `before`."""
    result = session.execute(delete(ModelPresence).where(ModelPresence.seen_at < before))
    return int(result.rowcount)  # type: ignore[attr-defined]


def live(*, session: Session, since: datetime) -> list[ModelPresence]:
    """Every row of a live child, by model, version and device."""
    return list(
        session.scalars(
            select(ModelPresence)
            .where(ModelPresence.seen_at >= since)
            .order_by(
                ModelPresence.name,
                ModelPresence.version,
                ModelPresence.device,
                ModelPresence.child,
            )
        )
    )


def holders(
    *,
    session: Session,
    name: str,
    version: int,
    since: datetime,
    states: Collection[str] = HOLDING,
    exclude: str | None = None,
) -> list[str]:
    """The live children (ids) that hold this version in one of `states`, `exclude` aside."""
    query = select(ModelPresence.child).where(
        ModelPresence.name == name,
        ModelPresence.version == version,
        ModelPresence.seen_at >= since,
        ModelPresence.state.in_(list(states)),
    )
    if exclude is not None:
        query = query.where(ModelPresence.child != exclude)
    return list(session.scalars(query))
