"""A worker's main process takes back a dead child's jobs at once (worker/orphans.py), on SQLite
and PostgreSQL. Children are a seam here (a list of pids); `own_children` is checked against
real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import JobErrorCode, JobStatus
from tests.db.conftest import MakeJobs, make_jobs

__all__ = ["make_jobs"]  # a fixture, shared with tests/db
from worker.orphans import OrphanWatcher, own_children, owner_prefix

pytestmark = pytest.mark.both_databases

Sessions = sessionmaker[Session]


class Children:
    def __init__(self, *pids: int) -> None:
        self.pids = set(pids)

    def __call__(self) -> set[int]:
        return set(self.pids)


class Watched:
    """A watcher over fake children, recording what it wakes and announces."""

    def __init__(self, sessions: Sessions, children: Children, max_attempts: int = 3) -> None:
        self.woken: list[tuple[str, int, list[str]]] = []
        self.announced: list[str] = []
        self.watcher = OrphanWatcher(
            sessions=sessions,
            host="h",
            max_attempts=max_attempts,
            wake=self.wake,
            announce=self.announced.extend,
            children=children,
        )

    def wake(self, model: str, version: int, job_ids: Sequence[str]) -> None:
        self.woken.append((model, version, list(job_ids)))


def claim(sessions: Sessions, ids: list[str], owner: str) -> None:
    with sessions.begin() as session:
        assert len(jobs.claim(session=session, job_ids=ids, owner=owner, lease_s=600)) == len(ids)


def status(sessions: Sessions, job_id: str) -> tuple[str, str | None, str | None]:
    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        return job.status, job.error_code, job.lease_owner


def test_a_dead_childs_jobs_are_queued_again_and_woken_and_no_one_elses(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    dead, alive, namesake, other_host = (make_jobs(1)[0] for _ in range(4))
    claim(sessions, [dead], "h/12/cpu:0/aaaaaa")
    claim(sessions, [alive], "h/123/cpu:1/bbbbbb")  # a pid that starts like the dead one
    claim(sessions, [namesake], "h/1/cpu:0/cccccc")
    claim(sessions, [other_host], "g/12/cpu:0/dddddd")  # the same pid on another host
    children = Children(12, 123, 1)
    watched = Watched(sessions, children)

    assert watched.watcher.check() == []  # it learns its children first
    children.pids.discard(12)
    assert watched.watcher.check() == [12]

    assert status(sessions, dead) == (JobStatus.QUEUED.value, None, None)
    assert watched.woken == [("m", 1, [dead])]
    for job_id in (alive, namesake, other_host):
        assert status(sessions, job_id)[0] == JobStatus.RUNNING.value
    assert watched.watcher.check() == []  # once


def test_a_job_out_of_attempts_ends_worker_lost_and_is_announced(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs(1)
    claim(sessions, [job_id], "h/7/cpu:0/x")
    children = Children(7)
    watched = Watched(sessions, children, max_attempts=1)
    watched.watcher.check()
    children.pids.clear()
    watched.watcher.check()

    job_status, code, _ = status(sessions, job_id)
    assert (job_status, code) == (JobStatus.FAILED.value, JobErrorCode.WORKER_LOST.value)
    assert watched.announced == [job_id]
    assert watched.woken == []


def test_a_hand_back_that_fails_is_tried_again_on_the_next_look(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    (job_id,) = make_jobs(1)
    claim(sessions, [job_id], "h/7/cpu:0/x")
    children = Children(7)
    watched = Watched(sessions, children)
    watched.watcher.check()
    children.pids.clear()

    class Away:
        def begin(self) -> Session:
            raise OSError("database away")

    watched.watcher._sessions = Away()  # type: ignore[assignment]
    with pytest.raises(OSError):
        watched.watcher.check()
    watched.watcher._sessions = sessions
    assert watched.watcher.check() == [7]
    assert status(sessions, job_id)[0] == JobStatus.QUEUED.value


@pytest.mark.slow  # starts a process
def test_own_children_sees_a_child_come_and_go() -> None:
    before = own_children()
    assert before is not None  # Linux
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc.pid in (own_children() or set())
        proc.kill()
        # Dead, not reaped yet: a zombie is no living child.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        assert proc.pid not in (own_children() or set())
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in (own_children() or set())


def test_owner_prefix_ends_at_the_pid() -> None:
    assert owner_prefix("host-1", 42) == "host-1/42/"
