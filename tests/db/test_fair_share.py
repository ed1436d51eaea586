"""Fair share: the tenants waiting for a model take turns in every batch (weighted); a tenant's
own jobs go by priority, then age (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections import Counter

from sqlalchemy.orm import Session, sessionmaker

from db import jobs, tenants
from tests.db.conftest import MakeJobs

Sessions = sessionmaker[Session]


def claim(sessions: Sessions, max_samples: int) -> list[str]:
    with sessions.begin() as session:
        leases = jobs.claim_next_fresh(
            session=session, model="m", version=1, owner="w", lease_s=60, max_samples=max_samples
        )
    return [lease.job_id for lease in leases]


def test_a_tenant_with_one_job_is_served_in_the_next_batch_beside_a_big_backlog(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    backlog = make_jobs(500, tenant="a")
    late = make_jobs(1, tenant="b")

    taken = claim(sessions, 8)

    assert late[0] in taken
    assert [job_id for job_id in taken if job_id != late[0]] == backlog[:7]


def test_waiting_tenants_share_a_batch_equally_by_default(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    a, b, c = make_jobs(20, tenant="a"), make_jobs(20, tenant="b"), make_jobs(20, tenant="c")
    owner = {job_id: name for name, ids in (("a", a), ("b", b), ("c", c)) for job_id in ids}

    taken = claim(sessions, 12)

    assert Counter(owner[job_id] for job_id in taken) == {"a": 4, "b": 4, "c": 4}


def test_a_weight_is_a_share_of_the_samples(make_jobs: MakeJobs, sessions: Sessions) -> None:
    heavy, light = make_jobs(30, tenant="heavy", samples=2), make_jobs(30, tenant="light")
    with sessions.begin() as session:
        tenants.set_limits(session=session, name="heavy", weight=3)

    taken = claim(sessions, 16)

    samples = Counter(
        {"heavy": 2 * len(set(taken) & set(heavy)), "light": len(set(taken) & set(light))}
    )
    assert samples == {"heavy": 12, "light": 4}


def test_a_tenants_own_jobs_go_by_priority_then_age(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    old, urgent = make_jobs(2, tenant="a"), make_jobs(1, tenant="a", priority=5)
    others = make_jobs(3, tenant="b")

    taken = claim(sessions, 4)

    assert [job_id for job_id in taken if job_id in old + urgent] == [urgent[0], old[0]]
    assert [job_id for job_id in taken if job_id in others] == others[:2]


def test_a_lone_job_larger_than_the_batch_is_still_taken_alone(
    make_jobs: MakeJobs, sessions: Sessions
) -> None:
    big = make_jobs(1, tenant="a", samples=50)
    make_jobs(3, tenant="b")

    first = claim(sessions, 8)

    assert first == big  # a's job waited longest: it goes first, alone (run in chunks)
