"""A child's claims reach its presence rows' `claimed_at` (what db/backlog.py `stalled_s` reads):
stamped by its next report with the database's time, carried forward by the reports after, never
written per claim. Through the Celery task's function (worker/tasks.py) on a real database; a
plain class stands in for TensorFlow (tests/worker/test_model_set.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import ModelPresence
from tests.worker.test_model_set import Fleet, add_version, fleet, make_child  # noqa: F401
from tffleet import tensors
from worker import child as worker_child
from worker import tasks
from worker.child import Child

Sessions = sessionmaker[Session]


def submit(sessions: Sessions, count: int = 1) -> list[str]:
    x = np.ones((1, 2), dtype=np.float32)
    new = [jobs.NewJob(model="m", version=1, samples=1, inputs=tensors.pack({"x": x}))] * count
    with sessions.begin() as session:
        return [job.id for job in jobs.create(session=session, jobs=new)]


def claimed_at(sessions: Sessions) -> datetime | None:
    with sessions() as session:
        (row,) = session.scalars(select(ModelPresence).where(ModelPresence.version == 1))
        return row.claimed_at


@pytest.fixture
def current(
    fleet: Fleet,  # noqa: F811
    make_child: Callable[..., Child],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Child:
    """The child process's one Child, as worker/child.py's `init` would set it."""
    add_version(fleet.repository, "m", 1)
    found = make_child(fleet.child())
    found.model_set.refresh()
    monkeypatch.setattr(worker_child, "_child", found)
    return found


def test_a_claim_is_stamped_by_the_next_report_and_carried_by_the_later_ones(
    current: Child, sessions: Sessions
) -> None:
    held = current.model_set.held
    held.report()
    assert claimed_at(sessions) is None  # loaded, never claimed

    answer = tasks.run_batch("m", 1, submit(sessions, 2))
    assert answer["claimed"] == 2
    assert claimed_at(sessions) is None  # no write per claim: the next report says it
    held.report()
    stamped = claimed_at(sessions)
    assert stamped is not None

    held.report()  # nothing claimed since: the time reported before is kept
    assert claimed_at(sessions) == stamped

    tasks.run_batch("m", 1, [])  # a message that finds nothing to claim
    held.report()
    assert claimed_at(sessions) == stamped

    tasks.run_batch("m", 1, submit(sessions))
    held.report()
    later = claimed_at(sessions)
    assert later is not None and later > stamped


def test_a_task_running_at_a_report_counts_as_a_claim(current: Child, sessions: Sessions) -> None:
    held = current.model_set.held
    held.report()
    with held.working(("m", 1)):  # a long batch, or a transform's shard
        held.report()
        first = claimed_at(sessions)
        held.report()
        second = claimed_at(sessions)
    assert first is not None and second is not None and second > first
    held.report()
    assert claimed_at(sessions) == second
