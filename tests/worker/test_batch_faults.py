"""The batcher when things go wrong: a batch past its time limit, a job lost before, a database
error mid-batch. A fake model (a NumPy function), on SQLite."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from sqlalchemy.exc import InterfaceError, OperationalError

from db import jobs
from db.models import JobStatus
from tests.worker.test_batching import (
    FakeRunner,
    Sessions,
    assert_own_outputs,
    policy,
    read,
    samples,
    submit,
)
from tffleet.announcements import EndedJob
from worker.batching import Batcher, BatchPolicy

SLOW = 99.0  # the slow runner sleeps on any batch holding this value


class SlowRunner(FakeRunner):
    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.sleep_s = sleep_s

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if (batch["x"] == SLOW).any():
            time.sleep(self.sleep_s)
        return super().run(batch)


class Faults:
    """A Batcher whose time-outs, wake-ups and notifications are recorded, not acted on."""

    def __init__(self, sessions: Sessions, *, lease_s: float = 30) -> None:
        self.timeouts = 0
        self.woken: list[tuple[str, int, list[str]]] = []
        self.notified: list[list[str]] = []  # the ids of each announcement
        self.announced: list[list[str | EndedJob]] = []
        self.batcher = Batcher(
            sessions=sessions,
            owner="t1",
            lease_s=lease_s,
            notify=self._notify,
            wake=lambda model, version, ids: self.woken.append((model, version, list(ids))),
            on_timeout=self._timed_out,
        )

    def _notify(self, ended: Sequence[str | EndedJob]) -> None:
        self.announced.append(list(ended))
        self.notified.append([e if isinstance(e, str) else e.id for e in ended])

    def _timed_out(self) -> None:
        self.timeouts += 1

    def run(self, job_ids: Sequence[str], runner: FakeRunner, batch_policy: BatchPolicy) -> Any:
        return self.batcher.run(
            model="m", version=1, job_ids=job_ids, runner=runner, policy=batch_policy
        )


def limited(timeout_s: float) -> BatchPolicy:
    base = policy()
    return BatchPolicy(
        max_batch_size=base.max_batch_size,
        max_queue_delay_ms=0,
        buckets=base.buckets,
        timeout_s=timeout_s,
    )


def slow_sample(seed: int) -> np.ndarray:
    x = samples(1, seed=seed)
    x[0, 0] = SLOW
    return x


def lose(sessions: Sessions, job_ids: list[str]) -> None:
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=job_ids, owner="dead", lease_s=60)
        jobs.release(session=session, leases=leases)


# time limit


def test_a_lone_job_past_its_time_limit_fails_timeout_and_its_late_result_is_discarded(
    sessions: Sessions,
) -> None:
    faults = Faults(sessions)
    job_id = submit(sessions, slow_sample(0))

    started = time.monotonic()
    report = faults.run([job_id], SlowRunner(sleep_s=0.6), limited(0.2))

    assert faults.timeouts == 1
    assert report.written == 0  # the forward pass ended after the time-out: fenced out
    job = read(sessions, job_id)
    assert (job.status, job.error_code, job.outputs) == (JobStatus.FAILED, "timeout", None)
    assert "0.2s" in (job.error_message or "")
    assert job.finished_at is not None and job.started_at is not None
    assert (job.finished_at - job.started_at).total_seconds() < 0.5  # ended at the limit
    assert [job_id] in faults.notified
    assert faults.woken == []
    assert time.monotonic() - started >= 0.6


def test_a_batch_past_its_time_limit_goes_back_to_the_queue_and_then_only_the_slow_job_fails(
    sessions: Sessions,
) -> None:
    faults = Faults(sessions)
    xs = [samples(1, seed=1), slow_sample(2), samples(2, seed=3)]
    ids = [submit(sessions, x) for x in xs]
    runner = SlowRunner(sleep_s=0.5)

    faults.run(ids, runner, limited(0.2))

    assert faults.timeouts == 1
    assert faults.woken == [("m", 1, ids)]
    for job_id in ids:
        job = read(sessions, job_id)
        assert (job.status, job.attempts, job.error_code) == (JobStatus.QUEUED, 1, None)

    # The wake-up (or the redelivered message): each job now runs alone.
    runner.batches.clear()
    faults.run(ids, runner, limited(0.2))

    assert runner.sizes == [1, 1, 2]
    assert faults.timeouts == 2
    assert_own_outputs(sessions, ids[0], xs[0])
    assert_own_outputs(sessions, ids[2], xs[2])
    slow = read(sessions, ids[1])
    assert (slow.status, slow.error_code, slow.attempts) == (JobStatus.FAILED, "timeout", 2)


def test_a_batch_within_its_time_limit_is_not_touched_and_its_leases_are_kept_alive(
    sessions: Sessions,
) -> None:
    faults = Faults(sessions, lease_s=0.3)
    x = slow_sample(4)
    job_id = submit(sessions, x)

    report = faults.run([job_id], SlowRunner(sleep_s=0.5), limited(5))

    assert (faults.timeouts, report.written) == (0, 1)
    assert_own_outputs(sessions, job_id, x)


# jobs lost before


def test_a_job_lost_before_runs_alone_and_is_never_topped_up_into_a_batch(
    sessions: Sessions,
) -> None:
    xs = [samples(1, seed=i) for i in range(4)]
    retried_named, fresh_named, fresh_other, retried_other = (submit(sessions, x) for x in xs)
    lose(sessions, [retried_named, retried_other])
    faults = Faults(sessions)
    runner = FakeRunner()

    report = faults.run([retried_named, fresh_named], runner, policy())

    assert runner.sizes == [2, 1]  # the fresh jobs together, then the lost one alone
    assert report.claimed == 3 and report.written == 3
    for job_id, x in zip([retried_named, fresh_named, fresh_other], xs, strict=False):
        assert_own_outputs(sessions, job_id, x)
    assert read(sessions, retried_named).attempts == 2
    other = read(sessions, retried_other)
    assert (other.status, other.attempts) == (JobStatus.QUEUED, 1)  # its own message runs it


def test_jobs_lost_before_named_by_one_message_each_run_in_their_own_forward_pass(
    sessions: Sessions,
) -> None:
    xs = [samples(1, seed=10 + i) for i in range(3)]
    ids = [submit(sessions, x) for x in xs]
    lose(sessions, ids)
    runner = FakeRunner()

    Faults(sessions).run(ids, runner, policy())

    assert runner.sizes == [1, 1, 1]
    for job_id, x in zip(ids, xs, strict=True):
        assert_own_outputs(sessions, job_id, x)


# database errors


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("UPDATE jobs", {}, Exception("server closed the connection")),
        InterfaceError("UPDATE jobs", {}, Exception("connection already closed")),
    ],
)
def test_a_database_error_while_writing_hands_the_jobs_back_and_raises_for_a_retry(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    ids = [submit(sessions, samples(1, seed=i)) for i in range(3)]

    def broken(**_: object) -> int:
        raise error

    monkeypatch.setattr(jobs, "complete", broken)
    faults = Faults(sessions)

    with pytest.raises(type(error)):
        faults.run(ids, FakeRunner(), policy())

    for job_id in ids:
        job = read(sessions, job_id)
        assert (job.status, job.lease_owner, job.outputs) == (JobStatus.QUEUED, None, None)
    assert faults.woken == [("m", 1, ids)]
    assert faults.notified == []


def test_a_database_error_while_topping_up_hands_back_what_was_claimed(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    named, *others = [submit(sessions, samples(1, seed=i)) for i in range(4)]
    real = jobs.claim_next_fresh
    calls = 0

    def flaky(**kwargs: Any) -> list[jobs.Lease]:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first claim takes two jobs; the top-up finds the database gone
            return real(**{**kwargs, "max_samples": 2})
        raise OperationalError("SELECT", {}, Exception("connection refused"))

    monkeypatch.setattr(jobs, "claim_next_fresh", flaky)
    faults = Faults(sessions)
    faults.batcher._queue_busy = True  # as after a batch that found company: it tops up

    with pytest.raises(OperationalError):
        faults.run([named], FakeRunner(), policy())

    assert calls == 2
    for job_id in [named, *others]:
        assert read(sessions, job_id).status == JobStatus.QUEUED
    ((_, _, woken),) = faults.woken
    assert sorted(woken) == sorted([named, others[0]])


def test_a_job_that_makes_the_model_raise_is_not_handed_back(sessions: Sessions) -> None:
    bad = samples(1, seed=0)
    bad[0, 1] = 13.0  # FakeRunner's POISON
    job_id = submit(sessions, bad)
    faults = Faults(sessions)

    faults.run([job_id], FakeRunner(), policy())

    job = read(sessions, job_id)
    assert (job.status, job.error_code, job.attempts) == (JobStatus.FAILED, "model_error", 1)
    assert faults.woken == []
