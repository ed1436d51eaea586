"""A job larger than a batch, split into parts that other children run (db/parts.py).

Over a fake model, on SQLite and on PostgreSQL. Two Batchers over one database stand for two
children: the first splits the job and runs a part, the second runs the parts it is woken for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, parts
from db.models import Job, JobStatus
from tests.worker.test_batching import POISON, FakeRunner, model_fn, policy, read, samples, submit
from tffleet import tensors
from tffleet.announcements import EndedJob
from worker.batching import Batcher

pytestmark = pytest.mark.both_databases

Sessions = sessionmaker[Session]


class Child:
    """A Batcher with one peer, recording its wake-ups and announcements."""

    def __init__(self, sessions: Sessions, name: str, *, peers: int = 1) -> None:
        self.woken: list[list[str]] = []
        self.notified: list[str] = []
        self.runner = FakeRunner()
        self.batcher = Batcher(
            sessions=sessions,
            owner=name,
            lease_s=30,
            notify=self._notify,
            wake=lambda model, version, ids: self.woken.append(list(ids)),
            peers=lambda model, version: peers,
        )

    def _notify(self, ended: Sequence[str | EndedJob]) -> None:
        self.notified += [e if isinstance(e, str) else e.id for e in ended]

    def run(self, job_ids: Sequence[str], max_batch_size: int = 4) -> Any:
        return self.batcher.run(
            model="m",
            version=1,
            job_ids=job_ids,
            runner=self.runner,
            policy=policy(max_batch_size=max_batch_size, buckets=(1, 2, 4)),
        )


def rows(sessions: Sessions) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_a_job_larger_than_a_batch_is_split_and_its_parts_run_on_every_child(
    sessions: Sessions,
) -> None:
    x = samples(10, seed=1)
    job_id = submit(sessions, x)
    first, second = Child(sessions, "c1"), Child(sessions, "c2")

    first.run([job_id])
    # The first child split the job into three parts (4 + 4 + 2 samples), ran what it claimed,
    # and woke the other child for the rest, with one message.
    (named,) = first.woken
    assert 1 <= len(named) <= 3
    second.run(named)
    first.run(named)  # whatever is left

    job = read(sessions, job_id)
    assert (job.status, job.parts, job.samples_done) == (JobStatus.SUCCEEDED, 3, 10)
    assert job.outputs is not None
    np.testing.assert_allclose(tensors.unpack(job.outputs)["y"], model_fn(x), rtol=1e-6)
    assert first.runner.sizes and second.runner.sizes, "both children ran parts"
    assert sorted(first.runner.sizes + second.runner.sizes) == [2, 4, 4]
    assert rows(sessions) == 1, "the parts are deleted once the job ends"
    assert job_id in first.notified + second.notified


def test_a_job_is_not_split_without_other_children_or_beside_other_queued_jobs(
    sessions: Sessions,
) -> None:
    alone = Child(sessions, "c1", peers=0)
    big = submit(sessions, samples(10, seed=1))
    alone.run([big])
    assert alone.runner.sizes == [4, 4, 2]  # chunks, one after another
    assert read(sessions, big).parts is None

    busy = Child(sessions, "c2", peers=1)
    big = submit(sessions, samples(10, seed=2))
    other = submit(sessions, samples(1, seed=3))
    busy.run([big, other])
    assert read(sessions, big).parts is None
    assert read(sessions, big).status == JobStatus.SUCCEEDED


def test_a_part_that_makes_the_model_raise_fails_the_job_with_its_samples_named(
    sessions: Sessions,
) -> None:
    x = samples(8, seed=1)
    x[6, 0] = POISON
    job_id = submit(sessions, x)
    child = Child(sessions, "c1")

    child.run([job_id])
    child.run(child.woken[0])

    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "model_error")
    assert job.error_message is not None and job.error_message.startswith("samples 4 to 7: ")
    assert rows(sessions) == 1


def test_a_part_lost_with_its_child_runs_again_alone_and_the_job_ends_once(
    sessions: Sessions,
) -> None:
    x = samples(8, seed=1)
    job_id = submit(sessions, x)
    child = Child(sessions, "c1")
    child.run([job_id])
    (named,) = child.woken
    # A child claims the other part and dies: its main process takes the part back.
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=named, owner="dead/1/", lease_s=30)
    with sessions.begin() as session:
        taken = jobs.take_back_from(session=session, owner_prefix="dead/1/", max_attempts=3)
    assert taken.requeued == {("m", 1): [lease.job_id]}

    child.run(named)

    job = read(sessions, job_id)
    assert (job.status, job.samples_done, job.attempts) == (JobStatus.SUCCEEDED, 8, 1)
    np.testing.assert_allclose(tensors.unpack(job.outputs)["y"], model_fn(x), rtol=1e-6)
    assert child.notified.count(job_id) == 1


def test_a_split_job_canceled_while_its_parts_wait_leaves_no_part_behind(
    sessions: Sessions,
) -> None:
    job_id = submit(sessions, samples(12, seed=1))
    child = Child(sessions, "c1")
    child.run([job_id], max_batch_size=4)
    assert rows(sessions) == 4

    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=job_id)

    assert read(sessions, job_id).status == JobStatus.CANCELED
    assert rows(sessions) == 1
    with sessions.begin() as session:
        assert parts.stranded(session=session) == []


def test_a_split_job_whose_part_was_lost_too_often_fails_at_the_next_sweep(
    sessions: Sessions,
) -> None:
    job_id = submit(sessions, samples(8, seed=1))
    child = Child(sessions, "c1")
    child.run([job_id])
    (named,) = child.woken
    for _ in range(3):  # a part that kills its child every time
        with sessions.begin() as session:
            jobs.claim(session=session, job_ids=named, owner="dead/1/", lease_s=30)
        with sessions.begin() as session:
            jobs.take_back_from(session=session, owner_prefix="dead/1/", max_attempts=3)

    with sessions.begin() as session:
        assert parts.stranded(session=session) == [job_id]
        assert parts.settle(session=session, parent_ids=[job_id]) == [job_id]

    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "worker_lost")
    assert job.error_message is not None and job.error_message.startswith("samples 4 to 7: ")
    assert rows(sessions) == 1


def test_progress_counts_the_samples_of_the_parts_that_succeeded(sessions: Sessions) -> None:
    job_id = submit(sessions, samples(12, seed=1))
    child = Child(sessions, "c1")

    child.run([job_id], max_batch_size=4)  # splits, then runs one part within this task...
    job = read(sessions, job_id)
    assert (job.status, job.parts) == (JobStatus.RUNNING, 3)
    assert job.samples_done is not None and 4 <= job.samples_done < 12


def test_a_message_naming_more_than_a_batch_is_shared_with_the_other_children_at_once(
    sessions: Sessions,
) -> None:
    ids = [submit(sessions, samples(1, seed=i)) for i in range(12)]
    first, second = Child(sessions, "c1", peers=2), Child(sessions, "c2", peers=2)

    first.run(ids)  # a fast model: alone, it would run all three batches itself

    # It kept a third and woke the two other children for a third each, before its first batch.
    assert [len(named) for named in first.woken[:2]] == [4, 4]
    assert sorted(first.woken[0] + first.woken[1]) == sorted(set(ids) - set(ids[::3]))
    for named in first.woken[:2]:
        second.run(named)
    assert all(read(sessions, job_id).status == JobStatus.SUCCEEDED for job_id in ids)


def test_a_split_job_of_a_model_with_a_cache_stores_its_joined_outputs(
    sessions: Sessions,
) -> None:
    from db import cache

    x = samples(8, seed=1)
    packed = tensors.pack({"x": x})
    key = cache.key(model="m", version=1, scope="default", inputs=packed)
    new = jobs.NewJob(model="m", version=1, samples=8, inputs=packed, cache_key=key)
    with sessions.begin() as session:
        (created,) = jobs.create(session=session, jobs=[new])
    child = Child(sessions, "c1")
    child.run([created.id])
    child.run(child.woken[0])
    assert read(sessions, created.id).status == JobStatus.SUCCEEDED

    with sessions.begin() as session:
        (again,) = jobs.create(session=session, jobs=[new])

    assert again.cached
    np.testing.assert_allclose(tensors.unpack(again.outputs)["y"], model_fn(x), rtol=1e-6)
