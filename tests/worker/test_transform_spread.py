"""A transform's shards spread over the children serving its model (worker/handoff.py
`before_shard`): the submit's one wake-up names every shard; a child that takes it claims a shard
and passes the rest on before it runs it, so an idle child runs the next shard beside it.

Two Batchers over one database stand for two children, a list for the model's queue: a message
goes to whichever child is idle, and the second child takes the first one's hand-off while the
first one's device still runs its shard (its runner's first forward pass). After every task,
each shard still queued is named by a message in the queue: none waits without a wake-up.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Job, JobStatus
from tests.datasets.files import images, npy
from tests.worker.test_batching import policy
from tests.worker.test_transform import SHAPE, ImageRunner, make_transform, put
from tffleet.settings import Settings
from worker.batching import Batcher, BatchReport

pytestmark = [
    pytest.mark.both_databases,
    pytest.mark.parametrize("object_store_url", ["file"], indirect=True),
]

Sessions = sessionmaker[Session]
SHARDS = 6


@pytest.fixture
def settings(object_store_url: str) -> Settings:
    return Settings(object_store=object_store_url)


class Fleet:
    """Children of one model over one database, and the model's queue of wake-ups."""

    def __init__(self, sessions: Sessions, settings: Settings, children: int) -> None:
        self.sessions = sessions
        self.queue: list[list[str]] = []
        self.children = [
            self._child(f"c{i}", settings, peers=children - 1) for i in range(children)
        ]

    def _child(self, name: str, settings: Settings, *, peers: int) -> Batcher:
        return Batcher(
            sessions=self.sessions, owner=name, lease_s=30, notify=lambda ended: None,
            wake=lambda model, version, ids: self.queue.append(list(ids)),
            peers=lambda model, version: peers, settings=settings,
        )  # fmt: skip

    def take(self, child: int, runner: ImageRunner) -> BatchReport:
        """The child takes the oldest message and runs its task."""
        report = self.children[child].run(
            model="m", version=1, job_ids=self.queue.pop(0), runner=runner,
            policy=policy(max_batch_size=4, buckets=(1, 2, 4)),
        )  # fmt: skip
        self.assert_every_queued_shard_named()
        return report

    def shards(self) -> list[Job]:
        with self.sessions() as session:
            return list(session.scalars(select(Job).order_by(Job.shard)))

    def assert_every_queued_shard_named(self) -> None:
        named = {job_id for message in self.queue for job_id in message}
        queued = {job.id for job in self.shards() if job.status == JobStatus.QUEUED}
        assert queued <= named, f"shards queued with no message: {sorted(queued - named)}"


def test_a_transforms_shards_run_on_both_children_and_none_waits_without_a_message(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(images(SHARDS * 8, SHAPE)))
    _, ids = make_transform(
        sessions, settings, uri, format="npy", output="npy", shard_records=8
    )  # each shard (8 records) larger than a batch (4): it runs alone
    fleet = Fleet(sessions, settings, children=2)
    fleet.queue.append(list(ids))  # the submit's one wake-up, naming every shard
    handed: list[int] = []
    beside: list[str] = []

    def second_child_takes_the_hand_off() -> None:
        # The first child's device runs its shard; what it raises would be the model's fault,
        # so the checks wait until after its task.
        handed.append(sum(len(message) for message in fleet.queue))
        fleet.take(1, ImageRunner())
        beside.extend(job.id for job in fleet.shards() if job.worker == "c1")

    fleet.take(0, ImageRunner(during=second_child_takes_the_hand_off, at=1))
    assert handed == [SHARDS - 1], "the rest of the message was handed on before the shard ran"
    assert len(beside) == 1, "the second child ran a shard while the first one's ran"
    turns = 0
    while fleet.queue:  # whichever child is idle takes the next message
        fleet.take(turns % 2, ImageRunner())
        turns += 1
        assert turns <= 2 * SHARDS, f"wake-ups without end: {fleet.queue}"

    shards = fleet.shards()
    assert [job.status for job in shards] == [JobStatus.SUCCEEDED] * SHARDS
    ran_on = {job.worker for job in shards}
    assert ran_on == {"c0", "c1"}, ran_on


def test_a_child_alone_keeps_the_message_and_runs_the_shards_itself(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(images(3 * 8, SHAPE)))
    _, ids = make_transform(sessions, settings, uri, format="npy", output="npy", shard_records=8)
    fleet = Fleet(sessions, settings, children=1)
    fleet.queue.append(list(ids))
    while fleet.queue:
        fleet.take(0, ImageRunner())
    assert [job.status for job in fleet.shards()] == [JobStatus.SUCCEEDED] * 3


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_message_whose_shards_another_claim_holds_is_passed_on_not_dropped(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(images(2 * 8, SHAPE)))
    _, ids = make_transform(sessions, settings, uri, format="npy", output="npy", shard_records=8)
    fleet = Fleet(sessions, settings, children=2)
    fleet.queue.append(list(ids))
    with sessions.begin() as other:
        # Another child's claim between its choice and its commit: it holds every candidate
        # (SELECT ... FOR UPDATE), though it takes one shard; this child's claim skips them.
        other.execute(select(Job.id).where(Job.id.in_(ids)).with_for_update())
        report = fleet.take(0, ImageRunner())
    assert report.claimed == 0
    assert fleet.queue == [ids], "the shards still queued went out again, in a message"
    while fleet.queue:
        fleet.take(1, ImageRunner())
    assert [job.status for job in fleet.shards()] == [JobStatus.SUCCEEDED] * 2


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_claim_that_found_the_shards_held_for_a_moment_claims_again_in_the_same_task(
    sessions: Sessions, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another child's claim commits a moment after this child's first claim skipped the shards
    it held: this task claims again after a short pause and runs one, instead of handing the
    message on (worker/feeder.py `_claim_again`)."""
    from db import jobs

    uri = put(settings, "in.npy", npy(images(2 * 8, SHAPE)))
    _, ids = make_transform(sessions, settings, uri, format="npy", output="npy", shard_records=8)
    fleet = Fleet(sessions, settings, children=2)
    fleet.queue.append(list(ids))
    held, skipped = threading.Event(), threading.Event()

    def other_claim() -> None:
        with sessions.begin() as other:  # holds every candidate until it commits
            other.execute(select(Job.id).where(Job.id.in_(ids)).with_for_update())
            held.set()
            skipped.wait(30)

    still_queued = jobs.still_queued

    def after_the_skip(**kwargs: Any) -> tuple[list[str], list[str]]:
        skipped.set()  # this child's first claim found nothing: the other one commits
        holder.join(30)
        return still_queued(**kwargs)

    holder = threading.Thread(target=other_claim)
    holder.start()
    assert held.wait(30)
    monkeypatch.setattr(jobs, "still_queued", after_the_skip)
    report = fleet.take(0, ImageRunner())
    monkeypatch.undo()
    assert report.claimed == 1, "the second claim, in the same task, took a shard"
    assert len(fleet.queue) == 1 and len(fleet.queue[0]) == 1, "only the other shard went on"
    while fleet.queue:
        fleet.take(1, ImageRunner())
    assert [job.status for job in fleet.shards()] == [JobStatus.SUCCEEDED] * 2
