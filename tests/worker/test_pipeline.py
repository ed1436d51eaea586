"""The batch pipeline: while one batch is on the device, the next is claimed and the last written.

Over a fake model that looks at the database from inside its forward pass, on SQLite and on
PostgreSQL. The faults are those of worker/retry.py: whatever stage the database fails in, every
lease the child held ends written or handed back, never left held.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import Job, JobStatus
from tests.worker.test_batching import FakeRunner, assert_own_outputs, policy, read, samples, submit
from tffleet.announcements import EndedJob
from worker import pipeline
from worker.batching import Batcher
from worker.pipeline import Arrays

Sessions = sessionmaker[Session]


def count(sessions: Sessions, status: JobStatus) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).where(Job.status == status.value)) or 0)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    ends = time.monotonic() + timeout_s
    while time.monotonic() < ends:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class Watching(FakeRunner):
    """A fake model whose forward pass k first calls `during[k]` (the device is busy meanwhile)."""

    def __init__(self, during: dict[int, Callable[[], Any]]) -> None:
        super().__init__()
        self.during = during
        self.seen: dict[int, Any] = {}

    def run(self, batch: Arrays) -> Arrays:
        k = len(self.batches)
        if k in self.during:
            self.seen[k] = self.during[k]()
        return super().run(batch)


def make_batcher(sessions: Sessions, *, device: str = "") -> tuple[Batcher, list[list[str]]]:
    notified: list[list[str]] = []

    def notify(ended: Sequence[str | EndedJob]) -> None:
        notified.append([e if isinstance(e, str) else e.id for e in ended])

    return Batcher(
        sessions=sessions, owner="t1", lease_s=30, notify=notify, device=device
    ), notified


def test_the_next_batch_is_claimed_while_one_is_on_the_device(sessions: Sessions) -> None:
    xs = [samples(1, seed=i) for i in range(12)]
    ids = [submit(sessions, x) for x in xs]
    batcher, _ = make_batcher(sessions)
    # Batch 0 takes 4 jobs; batch 1 is claimed while batch 0 is on the device.
    runner = Watching({0: lambda: wait_for(lambda: count(sessions, JobStatus.RUNNING) == 8)})

    report = batcher.run(
        model="m", version=1, job_ids=ids, runner=runner, policy=policy(max_batch_size=4)
    )

    assert runner.seen[0] is True
    assert runner.sizes == [4, 4, 4]
    assert report.succeeded == 12
    for job_id, x in zip(ids, xs, strict=True):
        assert_own_outputs(sessions, job_id, x)


def test_a_batch_is_written_while_the_next_one_is_on_the_device(sessions: Sessions) -> None:
    ids = [submit(sessions, samples(1, seed=i)) for i in range(8)]
    batcher, notified = make_batcher(sessions)
    runner = Watching({1: lambda: wait_for(lambda: count(sessions, JobStatus.SUCCEEDED) == 4)})

    batcher.run(model="m", version=1, job_ids=ids, runner=runner, policy=policy(max_batch_size=4))

    assert runner.seen[1] is True
    assert sorted(i for ended in notified for i in ended) == sorted(ids)


def test_every_batch_of_a_task_is_written_and_announced_before_it_returns(
    sessions: Sessions,
) -> None:
    ids = [submit(sessions, samples(1, seed=i)) for i in range(10)]
    batcher, notified = make_batcher(sessions)

    report = batcher.run(
        model="m", version=1, job_ids=ids, runner=FakeRunner(), policy=policy(max_batch_size=4)
    )

    assert (report.claimed, report.succeeded, report.written) == (10, 10, 10)
    assert count(sessions, JobStatus.SUCCEEDED) == 10
    assert sorted(i for ended in notified for i in ended) == sorted(ids)


def test_the_forward_passes_seconds_are_counted_per_device_and_model(sessions: Sessions) -> None:
    labels = {"device": "cpu:7", "model": "m"}
    before = REGISTRY.get_sample_value("tffleet_device_busy_seconds_total", labels) or 0.0
    ids = [submit(sessions, samples(1, seed=i)) for i in range(3)]
    batcher, _ = make_batcher(sessions, device="cpu:7")
    runner = Watching({0: lambda: time.sleep(0.2)})

    batcher.run(model="m", version=1, job_ids=ids, runner=runner, policy=policy())

    after = REGISTRY.get_sample_value("tffleet_device_busy_seconds_total", labels) or 0.0
    assert 0.2 <= after - before < 5


def fails_after_first_call(
    monkeypatch: pytest.MonkeyPatch, name: str, error: OperationalError
) -> None:
    """`db.jobs.<name>` works once, then raises `error`: the database went away mid-task."""
    real = getattr(jobs, name)
    calls = 0

    def flaky(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real(**kwargs)
        raise error

    monkeypatch.setattr(jobs, name, flaky)


def held(sessions: Sessions) -> list[str]:
    with sessions() as session:
        return list(session.scalars(select(Job.id).where(Job.lease_owner.is_not(None))))


def test_a_database_error_while_claiming_ahead_writes_the_batch_on_the_device_then_raises(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    xs = [samples(1, seed=i) for i in range(8)]
    ids = [submit(sessions, x) for x in xs]
    refused = OperationalError("SELECT", {}, Exception("connection refused"))
    fails_after_first_call(monkeypatch, "claim_next_fresh", refused)
    batcher, _ = make_batcher(sessions)

    with pytest.raises(OperationalError):
        batcher.run(
            model="m", version=1, job_ids=ids, runner=FakeRunner(), policy=policy(max_batch_size=4)
        )

    for job_id, x in zip(ids[:4], xs[:4], strict=True):
        assert_own_outputs(sessions, job_id, x)
    assert [read(sessions, i).status for i in ids[4:]] == [JobStatus.QUEUED] * 4
    assert held(sessions) == []
    assert batcher._heartbeat.kept() == []


def test_a_database_error_while_writing_hands_back_that_batch_and_the_ones_after_it(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [submit(sessions, samples(1, seed=i)) for i in range(12)]
    closed = OperationalError("UPDATE jobs", {}, Exception("server closed the connection"))
    fails_after_first_call(monkeypatch, "complete", closed)
    batcher, _ = make_batcher(sessions)

    with pytest.raises(OperationalError):
        batcher.run(
            model="m", version=1, job_ids=ids, runner=FakeRunner(), policy=policy(max_batch_size=4)
        )

    assert count(sessions, JobStatus.SUCCEEDED) == 4
    assert count(sessions, JobStatus.QUEUED) == 8
    assert held(sessions) == []
    assert batcher._heartbeat.kept() == []


def test_a_batch_claimed_ahead_is_kept_alive_while_it_waits_for_the_device(
    sessions: Sessions,
) -> None:
    ids = [submit(sessions, samples(1, seed=i)) for i in range(8)]
    notified: list[Sequence[str | EndedJob]] = []
    batcher = Batcher(sessions=sessions, owner="t1", lease_s=0.3, notify=notified.append)

    def expiries() -> dict[str, Any]:
        with sessions() as session:
            return dict(session.execute(select(Job.id, Job.lease_expires_at)).all())

    def slow() -> dict[str, Any]:
        wait_for(lambda: count(sessions, JobStatus.RUNNING) == 8)
        first = expiries()
        time.sleep(0.6)  # two lease lengths: the batch waiting for the device keeps its leases
        return {"first": first, "then": expiries()}

    runner = Watching({0: slow})
    batcher.run(model="m", version=1, job_ids=ids, runner=runner, policy=policy(max_batch_size=4))

    first, then = runner.seen[0]["first"], runner.seen[0]["then"]
    waiting = [i for i in ids if first[i] is not None and i not in ids[:4]]
    assert waiting
    assert all(then[i] > first[i] for i in waiting)
    assert count(sessions, JobStatus.SUCCEEDED) == 8


_GRAPH_ERROR = """Graph execution error:

Detected at node MatMul defined at (most recent call last):
  File "/srv/model.py", line 12, in serve
    return tf.matmul(x, w)

Matrix size-incompatible: In[0]: [1,5], In[1]: [4,2]
\t [[{{node MatMul}}]] [Op:__inference_signature_wrapper_40]"""


@pytest.mark.parametrize(
    ("error", "described"),
    [
        (ValueError("bad width"), "ValueError: bad width"),
        (
            RuntimeError(_GRAPH_ERROR),
            "RuntimeError: Graph execution error: Matrix size-incompatible: In[0]: [1,5], "
            "In[1]: [4,2]",
        ),
        (KeyError(), "KeyError: "),
    ],
)
def test_a_failure_is_one_line_with_the_cause_a_traceback_hides(
    error: Exception, described: str
) -> None:
    try:
        raise error
    except Exception:
        assert pipeline.describe_failure() == described
