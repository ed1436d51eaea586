"""Cross-job batching with a fake model (a NumPy function), on SQLite; the tests that lean on the
claim's order and locks on PostgreSQL too (`both_databases`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, tenants
from db.models import DEFAULT_TENANT, Job, JobStatus
from db.views import job_out
from tffleet import tensors
from tffleet.announcements import MAX_INLINE_OUTPUTS_BYTES, EndedJob
from worker import batching
from worker.batching import Batcher, BatchPolicy, BatchReport
from worker.pipeline import run_leases

Sessions = sessionmaker[Session]

W = np.array(
    [[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-2.0, 1.0, 0.75], [0.1, 0.2, 0.3]], dtype=np.float32
)
B = np.array([1.0, -2.0, 0.5], dtype=np.float32)
POISON = 13.0  # the fake model raises on any input holding this value


def model_fn(x: np.ndarray) -> np.ndarray:
    return x @ W + B


class FakeRunner:
    """y = x @ W + b, recording the batches it is given; `during_run` is called on the first."""

    inputs = {"x": {"dtype": "float32", "shape": [-1, 4]}}

    def __init__(self, during_run: Callable[[], None] | None = None) -> None:
        self.batches: list[np.ndarray] = []
        self._during_run = during_run

    @property
    def sizes(self) -> list[int]:
        return [len(x) for x in self.batches]

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = batch["x"]
        self.batches.append(x.copy())
        if self._during_run is not None:
            self._during_run()
            self._during_run = None
        if (x == POISON).any():
            raise ValueError(f"poisoned input\nvalue {POISON} is not allowed")
        return {"y": model_fn(x)}


def samples(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def submit(
    sessions: Sessions,
    x: np.ndarray,
    *,
    model: str = "m",
    version: int = 1,
    priority: int = 0,
    tenant: str = DEFAULT_TENANT,
    cancel_after_s: float | None = None,
) -> str:
    new = jobs.NewJob(
        model=model,
        version=version,
        samples=len(x),
        inputs=tensors.pack({"x": x}),
        priority=priority,
        tenant=tenant,
        cancel_after_s=cancel_after_s,
    )
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=tenant)
        (row,) = jobs.create(session=session, jobs=[new])
        return row.id


def read(sessions: Sessions, job_id: str) -> Job:
    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        _ = job.outputs  # deferred: load it before the session closes
        return job


def outputs_of(sessions: Sessions, job_id: str) -> dict[str, np.ndarray]:
    job = read(sessions, job_id)
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.error_message)
    assert job.outputs is not None
    return tensors.unpack(job.outputs)


def policy(
    max_batch_size: int = 16, buckets: Sequence[int] = (1, 2, 4, 8, 16), delay_ms: float = 0
) -> BatchPolicy:
    return BatchPolicy(
        max_batch_size=max_batch_size, max_queue_delay_ms=delay_ms, buckets=tuple(buckets)
    )


class BatchRun:
    """A Batcher over the test's database, with the notifications it sent."""

    def __init__(self, sessions: Sessions) -> None:
        self.notified: list[list[str]] = []  # the ids of each announcement
        self.announced: list[list[str | EndedJob]] = []
        self.batcher = Batcher(
            sessions=sessions,
            owner="t1",
            lease_s=30,
            notify=self._notify,
        )

    def _notify(self, ended: Sequence[str | EndedJob]) -> None:
        self.announced.append(list(ended))
        self.notified.append([e if isinstance(e, str) else e.id for e in ended])

    def run(
        self,
        job_ids: Sequence[str],
        runner: FakeRunner,
        batch_policy: BatchPolicy | None = None,
    ) -> BatchReport:
        return self.batcher.run(
            model="m",
            version=1,
            job_ids=job_ids,
            runner=runner,
            policy=batch_policy or policy(),
        )


@pytest.fixture
def batch(sessions: Sessions) -> BatchRun:
    return BatchRun(sessions)


def assert_own_outputs(sessions: Sessions, job_id: str, x: np.ndarray) -> None:
    out = outputs_of(sessions, job_id)
    assert list(out) == ["y"]
    assert out["y"].shape == (len(x), 3)
    np.testing.assert_allclose(out["y"], model_fn(x), rtol=1e-6)


# one batch, many jobs


def test_each_job_gets_its_own_outputs_when_sizes_and_priorities_mix(
    sessions: Sessions, batch: BatchRun
) -> None:
    xs = [samples(n, seed) for seed, n in enumerate([1, 3, 2, 5])]
    ids = [submit(sessions, x, priority=p) for x, p in zip(xs, [0, 5, -1, 2], strict=True)]
    runner = FakeRunner()

    report = batch.run(ids, runner)

    assert runner.sizes == [16]  # one forward pass for all 11 samples, padded to a bucket
    assert report.as_dict() == {
        "claimed": 4,
        "succeeded": 4,
        "failed": 0,
        "samples": 11,
        "written": 4,
    }
    for job_id, x in zip(ids, xs, strict=True):
        assert_own_outputs(sessions, job_id, x)


def test_padding_never_leaks_into_a_jobs_outputs(sessions: Sessions, batch: BatchRun) -> None:
    x = samples(3, seed=1)
    job_id = submit(sessions, x)
    runner = FakeRunner()

    batch.run([job_id], runner)

    (seen,) = runner.batches
    assert seen.shape == (4, 4)
    np.testing.assert_array_equal(seen[:3], x)
    np.testing.assert_array_equal(seen[3:], 0)  # padding rows are zeros...
    assert_own_outputs(sessions, job_id, x)  # ...and their outputs are cut off


@pytest.mark.parametrize(("n", "padded"), [(1, 1), (2, 4), (4, 4), (5, 16), (16, 16)])
def test_a_batch_is_padded_to_the_smallest_bucket_that_holds_it(
    sessions: Sessions, batch: BatchRun, n: int, padded: int
) -> None:
    x = samples(n, seed=n)
    job_id = submit(sessions, x)
    runner = FakeRunner()

    batch.run([job_id], runner, policy(max_batch_size=16, buckets=(1, 4, 16)))

    assert runner.sizes == [padded]
    assert_own_outputs(sessions, job_id, x)


def test_padded_size_is_the_smallest_bucket_at_least_the_sample_count() -> None:
    buckets = policy(max_batch_size=32, buckets=(1, 8, 32))
    assert [buckets.padded_size(n) for n in (1, 2, 8, 9, 31, 32)] == [1, 8, 8, 32, 32, 32]


def test_a_job_larger_than_max_batch_size_runs_in_chunks_reassembled_in_order(
    sessions: Sessions, batch: BatchRun
) -> None:
    x = np.arange(11 * 4, dtype=np.float32).reshape(11, 4) + 0.5  # rows differ; no POISON
    job_id = submit(sessions, x)
    runner = FakeRunner()

    report = batch.run([job_id], runner, policy(max_batch_size=4, buckets=(1, 2, 4)))

    assert runner.sizes == [4, 4, 4]  # 4 + 4 + 3, the last chunk padded
    np.testing.assert_array_equal(np.concatenate(runner.batches)[:11], x)
    assert report.samples == 11 and report.succeeded == 1
    assert_own_outputs(sessions, job_id, x)


def test_jobs_that_together_exceed_max_batch_size_are_chunked_and_split_back(
    sessions: Sessions, batch: BatchRun
) -> None:
    xs = [samples(n, seed) for seed, n in enumerate([3, 3, 3])]
    ids = [submit(sessions, x) for x in xs]
    runner = FakeRunner()

    batch.run(ids, runner, policy(max_batch_size=4, buckets=(1, 2, 4)))

    assert all(size <= 4 for size in runner.sizes)
    for job_id, x in zip(ids, xs, strict=True):
        assert_own_outputs(sessions, job_id, x)


# top-up


@pytest.mark.both_databases
def test_top_up_takes_queued_jobs_of_the_same_model_version_by_priority_then_age(
    sessions: Sessions, batch: BatchRun
) -> None:
    named = submit(sessions, samples(2, seed=0))
    older = submit(sessions, samples(2, seed=1))
    urgent = submit(sessions, samples(2, seed=2), priority=5)
    newer = samples(2, seed=3)
    submit(sessions, newer)
    runner = FakeRunner()

    report = batch.run([named], runner, policy(max_batch_size=6, buckets=(1, 2, 4, 6)))

    # The first batch: the urgent job, then the oldest two; the newest is left for the next
    # (the queue was busy, so the task went on with it).
    assert runner.sizes == [6, 2]
    np.testing.assert_array_equal(runner.batches[1], newer)
    assert report.claimed == 4
    for job_id in (named, urgent, older):
        assert read(sessions, job_id).status == JobStatus.SUCCEEDED


def test_top_up_never_takes_jobs_of_other_models_or_versions(
    sessions: Sessions, batch: BatchRun
) -> None:
    named = submit(sessions, samples(1, seed=0))
    other_version = submit(sessions, samples(1, seed=1), version=2, priority=9)
    other_model = submit(sessions, samples(1, seed=2), model="n", priority=9)
    runner = FakeRunner()

    report = batch.run([named], runner)

    assert report.claimed == 1
    assert runner.sizes == [1]
    assert read(sessions, other_version).status == JobStatus.QUEUED
    assert read(sessions, other_model).status == JobStatus.QUEUED
    assert batch.notified == [[named]]


def test_top_up_leaves_a_job_larger_than_the_room_left_queued(
    sessions: Sessions, batch: BatchRun
) -> None:
    named = submit(sessions, samples(1, seed=0))
    big = submit(sessions, samples(10, seed=1))
    runner = FakeRunner()

    report = batch.run([named], runner, policy(max_batch_size=4, buckets=(1, 2, 4)))

    assert report.claimed == 1 and runner.sizes == [1]
    assert read(sessions, big).status == JobStatus.QUEUED


def test_top_up_runs_queued_jobs_even_when_the_named_ones_are_gone(
    sessions: Sessions, batch: BatchRun
) -> None:
    x = samples(2, seed=0)
    queued = submit(sessions, x)

    report = batch.run(["00000000-0000-7000-8000-000000000000"], FakeRunner())

    assert report.claimed == 1
    assert_own_outputs(sessions, queued, x)


def make_busy(sessions: Sessions, batch: BatchRun) -> None:
    """As after a batch that found other jobs waiting: the batcher knows the queue is busy. (A
    task goes on while the queue is busy, so a real run ends with it idle or out of batches.)"""
    batch.batcher._queue_busy = True


def test_top_up_waits_for_a_job_that_arrives_within_max_queue_delay_while_busy(
    sessions: Sessions, batch: BatchRun
) -> None:
    make_busy(sessions, batch)
    first, late = samples(1, seed=0), samples(1, seed=1)
    named = submit(sessions, first)
    arrived: list[str] = []
    submitter = threading.Timer(0.05, lambda: arrived.append(submit(sessions, late)))
    runner = FakeRunner()

    submitter.start()
    started = time.monotonic()
    report = batch.run([named], runner, policy(max_batch_size=2, buckets=(1, 2), delay_ms=5000))
    elapsed = time.monotonic() - started
    submitter.join()

    assert report.claimed == 2
    assert runner.sizes == [2]
    assert elapsed < 4  # a full batch runs at once, without waiting out the delay
    assert_own_outputs(sessions, named, first)
    assert_own_outputs(sessions, arrived[0], late)


def test_top_up_waits_at_most_max_queue_delay_while_busy(
    sessions: Sessions, batch: BatchRun
) -> None:
    make_busy(sessions, batch)
    named = submit(sessions, samples(1, seed=0))

    started = time.monotonic()
    report = batch.run([named], FakeRunner(), policy(delay_ms=100))
    elapsed = time.monotonic() - started

    assert report.claimed == 1
    assert 0.1 <= elapsed < 2


def test_while_busy_it_waits_for_company_by_reading_and_claims_once_at_the_end(
    sessions: Sessions, batch: BatchRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_busy(sessions, batch)
    named = submit(sessions, samples(1, seed=0))
    claims: list[int] = []
    real = jobs.claim_next_fresh

    def counted(**kwargs: Any) -> list[jobs.Lease]:
        claims.append(len(leases := real(**kwargs)))
        return leases

    monkeypatch.setattr(jobs, "claim_next_fresh", counted)

    report = batch.run([named], FakeRunner(), policy(delay_ms=200))

    # The first claim, and one at the end of the delay: a write transaction each (on SQLite
    # the lock every insert waits for), not one per look at the queue.
    assert report.claimed == 1
    assert claims == [1, 0]


def test_a_lone_job_at_idle_runs_at_once_without_waiting_for_company(
    sessions: Sessions, batch: BatchRun
) -> None:
    named = submit(sessions, samples(1, seed=0))

    started = time.monotonic()
    report = batch.run([named], FakeRunner(), policy(delay_ms=5000))

    assert report.claimed == 1
    assert time.monotonic() - started < 2


def test_a_message_naming_more_jobs_than_max_batch_size_runs_them_in_batches(
    sessions: Sessions, batch: BatchRun
) -> None:
    named = [submit(sessions, samples(1, seed=i)) for i in range(5)]
    runner = FakeRunner()

    report = batch.run(named, runner, policy(max_batch_size=2, buckets=(1, 2)))

    assert report.claimed == 5 and report.succeeded == 5
    assert runner.sizes == [2, 2, 1]
    assert batch.notified == [named[0:2], named[2:4], named[4:5]]


@pytest.mark.both_databases
def test_a_message_is_a_hint_another_tenants_later_job_runs_in_its_first_batch(
    sessions: Sessions, batch: BatchRun
) -> None:
    bulk = [submit(sessions, samples(1, seed=i), tenant="a") for i in range(8)]
    late = submit(sessions, samples(1, seed=99), tenant="b")

    report = batch.run(bulk[:4], FakeRunner(), policy(max_batch_size=4, buckets=(1, 2, 4)))

    assert late in batch.notified[0]
    # Two batches until every named job had left the queue, then on while the queue was busy.
    assert report.claimed == 9
    for job_id in [*bulk[:4], late]:
        assert read(sessions, job_id).status == JobStatus.SUCCEEDED


def test_a_message_is_a_hint_a_later_urgent_job_runs_in_its_first_batch(
    sessions: Sessions, batch: BatchRun
) -> None:
    bulk = [submit(sessions, samples(1, seed=i)) for i in range(8)]
    urgent = submit(sessions, samples(1, seed=99), priority=10)

    batch.run(bulk[:4], FakeRunner(), policy(max_batch_size=4, buckets=(1, 2, 4)))

    assert batch.notified[0][0] == urgent


def test_a_message_that_runs_out_of_batches_publishes_its_named_jobs_again(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batching, "MAX_EXTRA_BATCHES", 0)
    woken: list[list[str]] = []
    runs = BatchRun(sessions)
    runs.batcher.wake = lambda model, version, ids: woken.append(list(ids))
    urgent = [submit(sessions, samples(1, seed=i), priority=5) for i in range(2)]
    named = submit(sessions, samples(1, seed=9))

    runs.run([named], FakeRunner(), policy(max_batch_size=2, buckets=(1, 2)))

    assert read(sessions, urgent[0]).status == JobStatus.SUCCEEDED
    assert woken == [[named]]
    assert read(sessions, named).status == JobStatus.QUEUED


def test_a_message_past_its_time_budget_starts_no_batch_and_publishes_the_rest_again(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A message that names many jobs ends after TASK_BUDGET_S, so its child takes its next
    # message (a dead child's jobs, which go first) instead of running all of them.
    monkeypatch.setattr(batching, "TASK_BUDGET_S", 0.0)
    woken: list[list[str]] = []
    runs = BatchRun(sessions)
    runs.batcher.wake = lambda model, version, ids: woken.append(list(ids))
    named = [submit(sessions, samples(1, seed=i)) for i in range(6)]

    report = runs.run(named, FakeRunner(), policy(max_batch_size=2, buckets=(1, 2)))

    assert report.claimed == 2
    # More than a batch left: two messages, so another child takes half.
    assert woken == [named[2:4], named[4:]]


def test_a_message_whose_jobs_went_elsewhere_wakes_a_child_for_the_backlog_beside_it(
    sessions: Sessions,
) -> None:
    # Its own job ran on another child; twenty more wait. The task runs them while the queue is
    # busy, up to its last batch; then one message goes out for the one it consumed, so no
    # child idles beside the backlog for want of a message.
    woken: list[list[str]] = []
    runs = BatchRun(sessions)
    runs.batcher.wake_once = lambda model, version, ids: woken.append(list(ids))
    named = submit(sessions, samples(1, seed=0))
    waiting = [submit(sessions, samples(1, seed=i)) for i in range(1, 21)]
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[named], owner="elsewhere", lease_s=30)

    report = runs.run([named], FakeRunner(), policy(max_batch_size=2, buckets=(1, 2)))

    assert report.claimed == 2 * (1 + batching.MAX_EXTRA_BATCHES)
    (wake,) = woken
    assert len(wake) == 1 and set(wake) <= set(waiting)
    for job_id in wake:
        assert read(sessions, job_id).status == JobStatus.QUEUED


@pytest.mark.both_databases
def test_a_task_that_ends_without_a_last_claim_wakes_the_jobs_submitted_while_it_ran(
    sessions: Sessions,
) -> None:
    # A submission publishes no wake-up while one for its version waits in the broker (the
    # message of this task, before the child took it): the task owes that job a wake-up. Once its
    # named job is written, with the queue quiet, it ends without claiming again, so it checks.
    woken: list[list[str]] = []
    once: list[list[str]] = []
    runs = BatchRun(sessions)
    runs.batcher.wake = lambda model, version, ids: woken.append(list(ids))
    runs.batcher.wake_once = lambda model, version, ids: once.append(list(ids))
    named = submit(sessions, samples(1, seed=0))
    later: list[str] = []
    runner = FakeRunner(during_run=lambda: later.append(submit(sessions, samples(1, seed=1))))

    report = runs.run([named], runner, policy(max_batch_size=4, buckets=(1, 4)))

    assert report.claimed == 1 and (woken, once) == ([], [later])
    assert read(sessions, later[0]).status == JobStatus.QUEUED
    # With nothing else queued, the check sends nothing.
    report = runs.run(later, FakeRunner(), policy(max_batch_size=4, buckets=(1, 4)))
    assert report.claimed == 1 and (woken, once) == ([], [later])


# claims


@pytest.mark.both_databases
def test_jobs_claimed_by_someone_else_are_skipped(sessions: Sessions, batch: BatchRun) -> None:
    mine, theirs = samples(2, seed=0), samples(3, seed=1)
    mine_id, theirs_id = submit(sessions, mine), submit(sessions, theirs)
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=[theirs_id], owner="t2", lease_s=30)
    runner = FakeRunner()

    report = batch.run([mine_id, theirs_id], runner)

    assert report.claimed == 1 and report.samples == 2
    np.testing.assert_array_equal(runner.batches[0][:2], mine)
    assert_own_outputs(sessions, mine_id, mine)
    other = read(sessions, theirs_id)
    assert other.status == JobStatus.RUNNING and other.lease_owner == "t2"
    assert other.outputs is None
    assert batch.notified == [[mine_id]]


def test_nothing_runs_and_nothing_is_notified_when_no_job_can_be_claimed(
    sessions: Sessions, batch: BatchRun
) -> None:
    job_id = submit(sessions, samples(1, seed=0))
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=job_id)
    runner = FakeRunner()

    report = batch.run([job_id], runner)

    assert report.as_dict() == {
        "claimed": 0,
        "succeeded": 0,
        "failed": 0,
        "samples": 0,
        "written": 0,
    }
    assert runner.batches == []
    assert batch.notified == []


def test_the_lease_is_extended_while_a_long_batch_runs(sessions: Sessions) -> None:
    job_id = submit(sessions, samples(1, seed=0))
    expiries: list[Any] = []

    def watch() -> None:
        for _ in range(2):
            expiries.append(read(sessions, job_id).lease_expires_at)
            time.sleep(0.25)

    batcher = Batcher(sessions=sessions, owner="t1", lease_s=0.3, notify=lambda _: None)
    report = batcher.run(
        model="m", version=1, job_ids=[job_id], runner=FakeRunner(during_run=watch), policy=policy()
    )

    assert report.written == 1
    assert expiries[1] > expiries[0]  # a heartbeat (every lease_s / 3) pushed it on


# failures


def test_a_job_that_makes_the_model_raise_fails_alone_with_model_error(
    sessions: Sessions, batch: BatchRun
) -> None:
    good_before, good_after = samples(2, seed=0), samples(3, seed=1)
    bad = samples(2, seed=2)
    bad[1, 2] = POISON
    ids = [submit(sessions, x) for x in (good_before, bad, good_after)]

    report = batch.run(ids, FakeRunner())

    assert (report.succeeded, report.failed, report.written) == (2, 1, 3)
    assert_own_outputs(sessions, ids[0], good_before)
    assert_own_outputs(sessions, ids[2], good_after)
    failed = read(sessions, ids[1])
    assert failed.status == JobStatus.FAILED
    assert failed.error_code == "model_error"
    # One line: the message's first, and its last (where the cause usually is).
    assert failed.error_message == "ValueError: poisoned input value 13.0 is not allowed"
    assert failed.outputs is None


def test_a_lone_job_that_makes_the_model_raise_fails_with_model_error(
    sessions: Sessions, batch: BatchRun
) -> None:
    bad = np.full((1, 4), POISON, dtype=np.float32)
    job_id = submit(sessions, bad)

    report = batch.run([job_id], FakeRunner())

    assert (report.succeeded, report.failed) == (0, 1)
    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "model_error")


def test_a_job_whose_stored_inputs_cannot_be_decoded_fails_alone(
    sessions: Sessions, batch: BatchRun
) -> None:
    good = samples(2, seed=0)
    good_id = submit(sessions, good)
    with sessions.begin() as session:
        (corrupt,) = jobs.create(
            session=session, jobs=[jobs.NewJob(model="m", version=1, samples=1, inputs=b"junk")]
        )

    report = batch.run([good_id, corrupt.id], FakeRunner())

    assert (report.succeeded, report.failed) == (1, 1)
    assert_own_outputs(sessions, good_id, good)
    job = read(sessions, corrupt.id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "model_error")
    assert job.error_message == "TensorError: not a packed tensor blob"


def test_notify_receives_every_claimed_job_id_once_the_batch_is_written(
    sessions: Sessions, batch: BatchRun
) -> None:
    bad = samples(1, seed=0)
    bad[0, 0] = POISON
    named = submit(sessions, samples(1, seed=1))
    failing = submit(sessions, bad)
    topped_up = submit(sessions, samples(2, seed=2))

    batch.run([named, failing], FakeRunner())

    assert len(batch.notified) == 1
    assert sorted(batch.notified[0]) == sorted([named, failing, topped_up])
    for job_id in batch.notified[0]:
        assert JobStatus(read(sessions, job_id).status).finished


def test_a_job_the_claim_cancels_for_its_deadline_is_announced_at_once(
    sessions: Sessions, batch: BatchRun
) -> None:
    late = submit(sessions, samples(1, seed=0), cancel_after_s=0.001)
    in_time = submit(sessions, samples(1, seed=1), cancel_after_s=60)
    time.sleep(0.05)
    runner = FakeRunner()

    report = batch.run([late, in_time], runner)

    assert report.claimed == 1 and runner.sizes == [1]
    job = read(sessions, late)
    assert job.status == JobStatus.CANCELED and job.error_code == "deadline"
    # Announced once its claim committed, before the batch it was not part of was written.
    assert batch.notified == [[late], [in_time]]
    assert read(sessions, in_time).status == JobStatus.SUCCEEDED


def test_a_job_claimed_before_and_now_past_its_deadline_is_announced_and_the_next_runs(
    sessions: Sessions, batch: BatchRun
) -> None:
    late = submit(sessions, samples(1, seed=0), cancel_after_s=0.5)
    other = submit(sessions, samples(1, seed=1))
    with sessions.begin() as session:  # both were lost once: each runs alone
        leases = jobs.claim(session=session, job_ids=[late, other], owner="gone", lease_s=30)
        jobs.release(session=session, leases=leases)
    time.sleep(0.6)
    runner = FakeRunner()

    batch.run([late, other], runner)

    assert read(sessions, late).status == JobStatus.CANCELED
    assert read(sessions, other).status == JobStatus.SUCCEEDED and runner.sizes == [1]
    assert batch.notified == [[late], [other]]


def test_a_job_the_claim_cancels_while_failing_unservable_jobs_is_announced(
    sessions: Sessions, batch: BatchRun
) -> None:
    late = submit(sessions, samples(1, seed=0), cancel_after_s=0.001)
    other = submit(sessions, samples(1, seed=1))
    time.sleep(0.05)

    batch.batcher.fail_named(model="m", version=1, job_ids=[late, other], message="no model")

    assert batch.notified == [[other, late]]
    assert read(sessions, late).status == JobStatus.CANCELED
    assert read(sessions, other).status == JobStatus.FAILED


def test_a_job_canceled_while_running_keeps_no_result(sessions: Sessions, batch: BatchRun) -> None:
    kept, dropped = samples(2, seed=0), samples(2, seed=1)
    kept_id, dropped_id = submit(sessions, kept), submit(sessions, dropped)

    def cancel() -> None:
        with sessions.begin() as session:
            jobs.cancel(session=session, job_id=dropped_id)

    report = batch.run([kept_id, dropped_id], FakeRunner(during_run=cancel))

    assert (report.claimed, report.succeeded, report.written) == (2, 2, 1)
    assert_own_outputs(sessions, kept_id, kept)
    job = read(sessions, dropped_id)
    assert job.status == JobStatus.CANCELED
    assert job.outputs is None
    # Not every result was written: the announcement names the jobs, it does not describe them.
    assert batch.announced == [[kept_id, dropped_id]]


# Announcements


def test_succeeded_jobs_are_announced_exactly_as_the_database_holds_them(
    sessions: Sessions, batch: BatchRun
) -> None:
    ids = [submit(sessions, samples(1, seed=0), priority=3), submit(sessions, samples(2, seed=1))]

    batch.run(ids, FakeRunner())

    (announced,) = batch.announced
    assert [job.id for job in announced if isinstance(job, EndedJob)] == ids
    for job in announced:
        assert isinstance(job, EndedJob)
        stored = read(sessions, job.id)
        assert job_out(job, encoding="b64") == job_out(stored, encoding="b64")
        assert job_out(job) == job_out(stored)


def test_a_job_with_large_outputs_is_announced_by_id(sessions: Sessions, batch: BatchRun) -> None:
    class WideRunner(FakeRunner):
        def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"y": np.zeros((len(batch["x"]), MAX_INLINE_OUTPUTS_BYTES), dtype=np.uint8)}

    job_id = submit(sessions, samples(1, seed=0))

    batch.run([job_id], WideRunner())

    assert batch.announced == [[job_id]]


def test_an_announcement_carries_outputs_up_to_its_budget_and_names_the_rest(
    sessions: Sessions, batch: BatchRun
) -> None:
    class WideRunner(FakeRunner):
        def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            width = MAX_INLINE_OUTPUTS_BYTES // 3  # two jobs' outputs fit, three do not
            return {"y": np.zeros((len(batch["x"]), width), dtype=np.uint8)}

    ids = [submit(sessions, samples(1, seed=i)) for i in range(3)]

    batch.run(ids, WideRunner())

    (announced,) = batch.announced
    assert [isinstance(job, EndedJob) for job in announced] == [True, True, False]
    assert batch.notified == [ids]


# run_leases (no database)


def lease(job_id: str, x: np.ndarray) -> jobs.Lease:
    return jobs.Lease(
        job_id=job_id,
        owner="t1",
        attempt=1,
        samples=len(x),
        priority=0,
        inputs=tensors.pack({"x": x}),
    )


def test_jobs_whose_sample_shapes_differ_run_in_separate_forward_passes() -> None:
    class AnyWidth(FakeRunner):
        def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.batches.append(batch["x"].copy())
            return {"y": batch["x"].sum(axis=1, keepdims=True)}

    narrow, wide = np.ones((2, 4), np.float32), np.ones((3, 5), np.float32)
    runner = AnyWidth()

    outcomes: dict[str, Any] = {
        held.job_id: out
        for held, out in run_leases(
            [lease("a", narrow), lease("b", wide)], runner=runner, policy=policy()
        )
    }

    assert sorted(x.shape for x in runner.batches) == [(2, 4), (4, 5)]
    np.testing.assert_array_equal(tensors.unpack(outcomes["a"])["y"], [[4], [4]])
    np.testing.assert_array_equal(tensors.unpack(outcomes["b"])["y"], [[5], [5], [5]])


def test_string_and_bool_inputs_are_padded_with_empty_strings_and_false() -> None:
    class Echo:
        inputs = {
            "text": {"dtype": "string", "shape": [-1]},
            "flag": {"dtype": "bool", "shape": [-1]},
        }
        seen: list[dict[str, np.ndarray]] = []

        def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.seen.append(batch)
            upper = np.array([t.upper() for t in batch["text"]], dtype=object)
            return {"upper": upper, "flag": ~batch["flag"]}

    def text_lease(job_id: str, words: list[bytes], flags: list[bool]) -> jobs.Lease:
        text = np.empty(len(words), dtype=object)
        text[:] = words
        inputs = tensors.pack({"text": text, "flag": np.array(flags)})
        return jobs.Lease(job_id, "t1", 1, len(words), 0, inputs)

    runner = Echo()
    leases = [text_lease("a", [b"ab", b"\xff"], [True, False]), text_lease("b", [b"c"], [True])]

    outcomes = dict(run_leases(leases, runner=runner, policy=policy()))

    (batch,) = runner.seen
    assert batch["text"].tolist() == [b"ab", b"\xff", b"c", b""]
    assert batch["flag"].tolist() == [True, False, True, False]
    a, b = (tensors.unpack(outcomes[held]) for held in leases)
    assert a["upper"].tolist() == [b"AB", b"\xff"] and a["flag"].tolist() == [False, True]
    assert b["upper"].tolist() == [b"C"] and b["flag"].tolist() == [False]


def test_jobs_for_a_model_this_child_cannot_run_end_model_error_and_are_announced(
    sessions: Sessions, batch: BatchRun
) -> None:
    named = submit(sessions, samples(1, seed=0))

    report = batch.batcher.fail_named(model="m", version=1, job_ids=[named], message="not loaded")

    assert report.claimed == report.failed == 1
    job = read(sessions, named)
    assert job.status == JobStatus.FAILED and job.error_code == "model_error"
    assert batch.notified == [[named]]
