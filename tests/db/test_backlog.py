"""A model's `stalled_s` (db/backlog.py): jobs queued, children ready, no claim, for how long.

Presence rows and queued jobs are written as the children and the API would, with times of the
database's clock moved back; both backends (tests/db).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from db import backlog, clock, jobs, presence
from db.models import Job, PresenceState
from tests.db.conftest import MakeJobs

Sessions = sessionmaker[Session]
POLL_S = 5.0
WARN_S = 60.0  # TFFLEET_STALL_WARN_S's default
LOADED = PresenceState.LOADED


def now(sessions: Sessions) -> datetime:
    with sessions() as session:
        return clock.now(session)


def queue(make_jobs: MakeJobs, sessions: Sessions, *, ago_s: float, version: int = 1) -> str:
    """A queued job of model m submitted `ago_s` seconds ago."""
    (job_id,) = make_jobs(version=version)
    with sessions.begin() as session:
        at = clock.now(session) - timedelta(seconds=ago_s)
        session.execute(update(Job).where(Job.id == job_id).values(created_at=at))
    return job_id


def report(
    sessions: Sessions,
    child: str,
    *,
    claimed_ago_s: float | None,
    version: int = 1,
    state: PresenceState = LOADED,
    seen_ago_s: float = 0.0,
) -> None:
    """A child's report of model m's version: last claimed `claimed_ago_s` ago (None: never)."""
    with sessions.begin() as session:
        at = clock.now(session)
        presence.report(
            session=session,
            child=presence.Child(id=child, host="h", pid=1, device="cpu:0"),
            holdings=[
                presence.Holding(
                    name="m",
                    version=version,
                    state=state,
                    path=f"/m/{version}",
                    since=at,
                    claimed_at=None
                    if claimed_ago_s is None
                    else at - timedelta(seconds=claimed_ago_s),
                )
            ],
            now=at - timedelta(seconds=seen_ago_s),
        )


def stalled(sessions: Sessions) -> float:
    with sessions() as session:
        return backlog.per_model(session=session, poll_s=POLL_S)["m"].stalled_s


def test_a_model_claimed_steadily_is_not_stalled_however_deep_its_backlog(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    queue(make_jobs, sessions, ago_s=600)  # waited ten minutes: slow, not stalled
    make_jobs(50)
    report(sessions, "child-1", claimed_ago_s=None)
    report(sessions, "child-2", claimed_ago_s=3)  # the newest claim of any child counts

    assert stalled(sessions) < 10


def test_no_claim_past_the_threshold_reads_the_time_since_the_last_claim(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    queue(make_jobs, sessions, ago_s=300)
    report(sessions, "child-1", claimed_ago_s=90)
    report(sessions, "child-2", claimed_ago_s=200)

    assert 90 <= stalled(sessions) < 100
    assert stalled(sessions) > WARN_S


def test_children_that_never_claimed_read_the_oldest_queued_jobs_age(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    queue(make_jobs, sessions, ago_s=120)
    queue(make_jobs, sessions, ago_s=30)
    report(sessions, "child-1", claimed_ago_s=None)

    assert 120 <= stalled(sessions) < 130


def test_jobs_that_came_after_the_last_claim_read_their_own_age(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    # Idle for an hour, then a job: the hour is no stall; the job's wait is.
    queue(make_jobs, sessions, ago_s=5)
    report(sessions, "child-1", claimed_ago_s=3600)

    assert 5 <= stalled(sessions) < 15


def test_without_ready_children_nothing_is_stalled(sessions: Sessions, make_jobs: MakeJobs) -> None:
    queue(make_jobs, sessions, ago_s=300)
    report(sessions, "loading", claimed_ago_s=None, state=PresenceState.LOADING)
    report(sessions, "failed", claimed_ago_s=None, state=PresenceState.FAILED)
    report(sessions, "dead", claimed_ago_s=200, seen_ago_s=60)  # silent for 3 polls

    found = _read(sessions)
    assert found.ready_children == 0
    assert found.without_capacity  # that state has its own gauge
    assert found.stalled_s == 0


def test_with_nothing_queued_nothing_is_stalled(sessions: Sessions, make_jobs: MakeJobs) -> None:
    running = queue(make_jobs, sessions, ago_s=300)
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[running], owner="child-1", lease_s=60)
    report(sessions, "child-1", claimed_ago_s=200)

    found = _read(sessions)
    assert (found.queued, found.running) == (0, 1)
    assert found.stalled_s == 0


def test_children_of_one_version_claiming_do_not_hide_another_versions_stall(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    queue(make_jobs, sessions, ago_s=200, version=1)
    queue(make_jobs, sessions, ago_s=100, version=2)
    report(sessions, "old", claimed_ago_s=150, version=1)
    report(sessions, "new", claimed_ago_s=2, version=2)

    assert 150 <= stalled(sessions) < 160  # version 1's


def test_a_version_no_live_child_holds_yet_is_not_stalled(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    # Jobs of a version still loading everywhere wait for it, not for a consumer.
    queue(make_jobs, sessions, ago_s=300, version=2)
    report(sessions, "child-1", claimed_ago_s=1, version=1)

    found = _read(sessions)
    assert found.ready_children == 1
    assert found.stalled_s == 0


def _read(sessions: Sessions) -> backlog.Backlog:
    with sessions() as session:
        return backlog.per_model(session=session, poll_s=POLL_S)["m"]
