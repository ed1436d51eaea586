"""Factories for job rows, on whichever backend the `sessions` fixture runs.

Every test here runs on SQLite and on PostgreSQL: SQL behaviour (claims, locks, sweeps, standing,
the console's reads, history, the clock) is what they test, and the two differ in it. So each
module of this folder is marked `both_databases` (tests/conftest.py) as it is collected.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, tenants
from db.models import DEFAULT_TENANT, Job
from tests.conftest import mark_each_module

MakeJobs = Callable[..., list[str]]


pytest_pycollect_makemodule = mark_each_module(pytest.mark.both_databases)


def read(sessions: sessionmaker[Session], job_id: str) -> Job:
    """The job as stored now, outputs loaded."""
    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        _ = job.outputs  # deferred: load it before the session closes
        return job


@pytest.fixture
def make_jobs(sessions: sessionmaker[Session]) -> MakeJobs:
    """Create and commit queued jobs; returns their ids in creation order."""

    def make(
        count: int = 1,
        *,
        model: str = "m",
        version: int = 1,
        samples: int = 1,
        priority: int = 0,
        tenant: str = DEFAULT_TENANT,
    ) -> list[str]:
        new = [
            jobs.NewJob(
                model=model,
                version=version,
                samples=samples,
                inputs=b"in",
                priority=priority,
                tenant=tenant,
            )
            for _ in range(count)
        ]
        with sessions.begin() as session:
            tenants.ensure_tenant(session=session, name=tenant)
            return [row.id for row in jobs.create(session=session, jobs=new)]

    return make
