"""A job's history: the lines that each attempt's start, each return to the queue and each retry
append to it, in the UPDATE that makes the change, and their reading.

Written by the claim (worker children), `release` and `unclaim` (worker children), the take-back
(the sweeper, a worker's main process) and `retry` (the API); read by the API's console
(`history_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, literal
from sqlalchemy.types import Text

from db.jobs._common import _jobs
from db.models import Job

# What a job's columns do not keep (each attempt's start and its worker, each return to the queue
# and why, each retry), one line each in `history`, appended by the UPDATE that makes the change:
# `event<TAB>ISO time<TAB>detail<LF>`. Creation and the end are its columns' (created_at,
# finished_at and status).


@dataclass(frozen=True)
class HistoryEvent:
    event: str  # "started", "requeued", "put back"; "failed" or "canceled", then "retried"
    at: datetime
    detail: str


def _history_line(event: str, at: datetime, detail: str = "") -> str:
    return f"{event}\t{at.isoformat()}\t{' '.join(detail.split())}\n"


def _appended(line: ColumnElement[str]) -> ColumnElement[str]:
    """`history` with `line` appended (in SQL: `coalesce(history, '') || line`)."""
    return func.coalesce(_jobs.c.history, literal("", Text)) + line


def _logged(event: str, at: datetime, detail: str = "") -> ColumnElement[str]:
    return _appended(literal(_history_line(event, at, detail), Text))


def history_of(job: Job) -> list[HistoryEvent]:
    """A job's history, oldest first (loads the deferred column: call it inside a session)."""
    events = []
    for line in (job.history or "").splitlines():
        event, at, detail = [*line.split("\t", 2), "", ""][:3]
        try:
            events.append(HistoryEvent(event, datetime.fromisoformat(at), detail))
        except ValueError:
            continue  # not a line this code wrote
    return events
