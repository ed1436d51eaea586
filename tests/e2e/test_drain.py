"""Scale-in without loss: SIGTERM to a worker's main process under a steady load.

First the drain logic itself (`worker.batching.Drain`, `Batcher.run`) over a fake model; then,
end to end, what `docker stop`, Kubernetes and systemd (`KillMode=mixed`) do to a worker they
scale in: the worker finishes the batches its children hold, claims nothing more, leaves every
other job queued with a wake-up in Redis, and exits 0 within `drain_bound_s`
(worker/batching.py). A second worker then runs the rest: every accepted job ends `succeeded`
exactly once, on its first claim, with the model's own outputs. No sweeper runs, so no lost
wake-up or stranded lease could be rescued.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from celery.signals import worker_shutting_down
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.engine import make_engine
from db.models import Job, JobStatus
from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.models import SLEEP_COLUMN, build_faulty
from tffleet import tensors
from worker.batching import DRAIN, Batcher, BatchPolicy, Drain, drain_bound_s

# The drain logic, over a fake model


class Doubler:
    """y = 2x, counting its forward passes; `during_run` is called on the first."""

    inputs = {"x": {"dtype": "float32", "shape": [-1, 4]}}

    def __init__(self, during_run: Callable[[], None] = lambda: None) -> None:
        self.passes = 0
        self._during_run = during_run

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.passes += 1
        if self.passes == 1:
            self._during_run()
        return {"y": batch["x"] * 2}


def submit_ones(sessions: sessionmaker[Session], n: int) -> list[str]:
    """n queued jobs of one sample each, model m:1."""
    new = [
        jobs.NewJob(
            model="m", version=1, samples=1, inputs=tensors.pack({"x": np.ones((1, 4), np.float32)})
        )
        for _ in range(n)
    ]
    with sessions.begin() as session:
        return [row.id for row in jobs.create(session=session, jobs=new)]


def statuses(sessions: sessionmaker[Session], ids: Sequence[str]) -> list[str]:
    with sessions() as session:
        return [jobs.get(session=session, job_id=i).status for i in ids]


class Woken:
    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, model: str, version: int, job_ids: Sequence[str]) -> None:
        self.ids.extend(job_ids)


def batcher(sessions: sessionmaker[Session], draining: Callable[[], bool], woken: Woken) -> Batcher:
    return Batcher(
        sessions=sessions,
        owner="host/1/cpu:0/abc",
        lease_s=30,
        notify=lambda ended: None,
        wake=woken,
        draining=draining,
    )


POLICY = BatchPolicy(max_batch_size=2, max_queue_delay_ms=0, buckets=(1, 2))


def test_a_task_that_starts_after_shutdown_began_claims_nothing_and_wakes_its_jobs_again(
    sessions: sessionmaker[Session],
) -> None:
    ids = submit_ones(sessions, 3)
    woken, runner = Woken(), Doubler()

    report = batcher(sessions, lambda: True, woken).run(
        model="m", version=1, job_ids=ids, runner=runner, policy=POLICY
    )

    assert (report.claimed, runner.passes) == (0, 0)
    assert statuses(sessions, ids) == [JobStatus.QUEUED] * 3
    assert sorted(woken.ids) == sorted(ids)  # for another worker: this message is acknowledged


def _running(sessions: sessionmaker[Session], ids: list[str]) -> int:
    return statuses(sessions, ids).count(JobStatus.RUNNING)


@pytest.mark.parametrize("when", ["at-once", "after-the-next-claim"])
def test_shutdown_that_begins_mid_message_ends_the_task_after_the_batch_it_holds(
    sessions: sessionmaker[Session], when: str
) -> None:
    # One message names 10 one-sample jobs: 5 batches of 2, and more allowed (MAX_EXTRA_BATCHES).
    # The shutdown begins during the first forward pass: before the feeder claims the next batch,
    # or once it has (then that batch does not start: its jobs go back to the queue).
    ids = submit_ones(sessions, 10)
    draining = threading.Event()

    def begin() -> None:
        deadline = time.monotonic() + 10
        while when != "at-once" and _running(sessions, ids) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        draining.set()

    woken, runner = Woken(), Doubler(during_run=begin)

    report = batcher(sessions, draining.is_set, woken).run(
        model="m", version=1, job_ids=ids, runner=runner, policy=POLICY
    )

    assert (report.claimed, report.succeeded, runner.passes) == (2, 2, 1)
    done = [i for i, s in zip(ids, statuses(sessions, ids), strict=True) if s == "succeeded"]
    assert len(done) == 2
    assert sorted(woken.ids) == sorted(set(ids) - set(done))
    assert statuses(sessions, woken.ids) == [JobStatus.QUEUED] * 8
    with sessions() as session:  # as if never claimed: none will be taken to run alone
        assert [jobs.get(session=session, job_id=i).attempts for i in woken.ids] == [0] * 8


def _wait_for_drain(flag: Drain, seen: multiprocessing.synchronize.Event) -> None:
    # In the forked child: poll the byte the parent sets.
    deadline = time.monotonic() + 10
    while not flag.began() and time.monotonic() < deadline:
        time.sleep(0.01)
    if flag.began():
        seen.set()


def test_the_drain_flag_the_main_process_sets_is_seen_by_its_forked_children() -> None:
    fork = multiprocessing.get_context("fork")
    flag, seen = Drain(), fork.Event()
    child = fork.Process(target=_wait_for_drain, args=(flag, seen))
    child.start()
    flag.begin()
    child.join(timeout=15)
    assert seen.is_set(), "the child never saw the flag"


@pytest.fixture
def drain_reset() -> Iterator[None]:
    DRAIN.reset()
    yield
    DRAIN.reset()  # every Batcher of this process reads it


def test_celerys_worker_shutting_down_signal_begins_the_drain(drain_reset: None) -> None:
    import worker.app  # noqa: F401  (connects the receiver, as the worker's main process does)

    assert not DRAIN.began()
    worker_shutting_down.send(sender="tffleet-1@host", sig="SIGTERM", how="Warm", exitcode=0)
    assert DRAIN.began()
    assert Batcher.__dataclass_fields__["draining"].default == DRAIN.began


# End to end

DEVICES = "cpu:2"
CHILDREN = 2
MAX_BATCH = 4  # samples; every job has one, so a batch is at most 4 jobs
FORWARD_PASS_S = 0.4  # each batch holds its child this long: a SIGTERM finds batches running
RATE = 25  # jobs per second, above the 2 x 4 / 0.4 = 20 the worker runs: a backlog builds
# Jobs per request, as `Client.submit_many` sends them: one wake-up names them all, so its task
# may run several batches (worker/batching.py `MAX_EXTRA_BATCHES`).
BULK = 40
JOB_TIMEOUT_S = 20.0
ENV = {
    "TFFLEET_MAX_BATCH_SIZE": str(MAX_BATCH),
    "TFFLEET_JOB_TIMEOUT_S": str(JOB_TIMEOUT_S),
    "TF_CPP_MIN_LOG_LEVEL": "2",
}
CHILD_LINE = re.compile(r"child \S+ \(pid (\d+), CUDA_VISIBLE_DEVICES=\S+\) loaded")
FINAL = ("succeeded", "failed", "canceled")


class Load:
    """Submits BULK jobs every BULK/RATE s from a thread of its own until stopped; keeps each
    accepted job's inputs by id."""

    def __init__(self, fleet: Fleet, *, rate: float, seed: int) -> None:
        self._fleet = fleet
        self._rate = rate
        self._rng = np.random.default_rng(seed)
        self.accepted: dict[str, np.ndarray] = {}
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the load did not stop"

    def _run(self) -> None:
        with self._fleet.http(timeout=30) as client:
            start, sent = time.monotonic(), 0
            while not self._stop.is_set():
                xs = self._rng.normal(size=(BULK, 1, 4)).astype(np.float32)
                xs[:, :, SLEEP_COLUMN] = FORWARD_PASS_S
                body = {"jobs": [{"model": "faulty", "inputs": {"x": x.tolist()}} for x in xs]}
                try:
                    r = client.post("/v1/jobs", json=body)
                except httpx.HTTPError as exc:  # the assertion after the load names it
                    self.refused.append(f"{type(exc).__name__}: {exc}")
                else:
                    if r.status_code == 202:
                        for job, x in zip(r.json()["jobs"], xs, strict=True):
                            self.accepted[job["id"]] = x
                    else:
                        self.refused.append(f"{r.status_code} {r.text[:200]}")
                sent += BULK
                self._stop.wait(max(0.0, start + sent / self._rate - time.monotonic()))


class Table:
    """The test's view of the jobs table."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)

    def rows(self) -> dict[str, Any]:
        query = select(
            Job.id, Job.status, Job.attempts, Job.worker, Job.lease_owner, Job.outputs,
            Job.finished_at,
        )  # fmt: skip
        with self.engine.connect() as conn:
            return {row.id: row for row in conn.execute(query)}

    def count(self, status: str) -> int:
        return sum(1 for row in self.rows().values() if row.status == status)


@pytest.fixture
def table(postgres_url: str) -> Iterator[Table]:
    clean_database(postgres_url)
    opened = Table(postgres_url)
    yield opened
    opened.engine.dispose()


def child_pids(log: str) -> set[int]:
    return {int(pid) for pid in CHILD_LINE.findall(log)}


def on(pids: set[int]) -> Callable[[str | None], bool]:
    """Whether a lease owner or `worker` value names one of these children."""
    return lambda owner: owner is not None and int(owner.split("/")[1]) in pids


def wait(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def freeze_holding_a_batch(
    pid: int, table: Table, by_drained: Callable[[str | None], bool]
) -> tuple[set[str], set[str]]:
    """SIGSTOP the worker (its main process and children) at a moment it runs a batch; returns
    the jobs it holds then, and the jobs that had ended."""
    for _ in range(50):
        os.killpg(pid, signal.SIGSTOP)
        time.sleep(0.3)  # a commit it had sent lands now
        rows = table.rows()
        held = {i for i, r in rows.items() if r.status == "running" and by_drained(r.lease_owner)}
        if held:
            return held, {i for i, r in rows.items() if r.status in FINAL}
        os.killpg(pid, signal.SIGCONT)
        time.sleep(0.05)
    pytest.fail("the worker was never caught running a batch")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_under_load_drains_within_the_bound_and_a_new_worker_runs_the_rest_once(
    fleet_factory: Callable[..., Fleet], postgres_url: str, tmp_path: Path, table: Table
) -> None:
    weights = build_faulty(tmp_path / "models")
    fleet = fleet_factory(postgres_url, tmp_path / "models", devices=DEVICES, extra_env=ENV)
    fleet.start_api(wait=False)  # ready while the worker loads TensorFlow
    fleet.start_worker()
    worker = fleet.procs["worker"]
    drained = child_pids(fleet.log("worker"))
    assert len(drained) == CHILDREN, fleet.log("worker")[-3000:]
    by_drained = on(drained)

    with Load(fleet, rate=RATE, seed=3) as load:
        wait(
            lambda: (
                table.count("succeeded") >= 40
                and table.count("queued") >= 3 * CHILDREN * MAX_BATCH
                and table.count("running") > 0
            ),
            "a steady state with a backlog",
            120,
        )
        held, ended = freeze_holding_a_batch(worker.pid, table, by_drained)
        # SIGTERM to its main process only, as `docker stop` and Kubernetes do; then let it go on.
        os.kill(worker.pid, signal.SIGTERM)
        os.killpg(worker.pid, signal.SIGCONT)
        sigterm_at = time.monotonic()
        bound_s = drain_bound_s(JOB_TIMEOUT_S)
        try:
            code = worker.wait(timeout=bound_s)
        except Exception:
            pytest.fail(f"the worker did not exit within {bound_s}s of SIGTERM")
        drain_s = time.monotonic() - sigterm_at
        time.sleep(2)  # submissions go on while no worker runs
    assert not load.refused, load.refused[:10]
    assert code == 0, fleet.log("worker")[-3000:]

    after = table.rows()
    claimed_since = {
        i for i, r in after.items() if by_drained(r.worker) and i not in held and i not in ended
    }
    print(
        f"drain: exited {drain_s:.2f}s after SIGTERM (bound {bound_s:g}s) holding {len(held)} "
        f"jobs; {len(claimed_since)} jobs claimed after the freeze; "
        f"{len(load.accepted)} accepted, {sum(r.status == 'queued' for r in after.values())} queued"
    )
    # The batches it held on its devices ran to the end and were written, once; a batch a child's
    # feeder had claimed but not started went back to the queue as if never claimed.
    for job_id in held:
        assert (after[job_id].status, after[job_id].attempts) in {("succeeded", 1), ("queued", 0)}
    put_back = [i for i in held if after[i].status == "queued"]
    assert len(put_back) <= CHILDREN * MAX_BATCH, put_back
    # Once shutdown began each child claimed nothing more: at most the batch a child was claiming
    # as the signal landed, not the further batches its message allowed.
    assert len(claimed_since) <= CHILDREN * MAX_BATCH, sorted(claimed_since)
    # Nothing is left under the drained worker's leases.
    assert not [i for i, r in after.items() if r.status == "running"], "a lease was left behind"

    fleet.start("worker2", "worker", "--log-level", "INFO")
    del fleet.procs["worker"]  # it exited: `wait_until` would fail on it
    fleet.wait_until(lambda: len(child_pids(fleet.log("worker2"))) == CHILDREN, "worker2", 180)
    assert not child_pids(fleet.log("worker2")) & drained

    ids = list(load.accepted)
    wait(
        lambda: all(r.status in FINAL for r in table.rows().values()),
        "every job ended",
        120,
    )
    first = table.rows()
    assert set(first) == set(ids), "jobs appeared or vanished"
    time.sleep(1.5)  # a late or duplicate writer would show here
    again = table.rows()
    for job_id, x in load.accepted.items():
        row = again[job_id]
        was = first[job_id]
        assert (row.status, row.outputs, row.finished_at, row.worker) == (
            was.status,
            was.outputs,
            was.finished_at,
            was.worker,
        ), f"job {job_id} changed after it ended"
        assert (row.status, row.attempts) == ("succeeded", 1), (job_id, row.status, row.attempts)
        np.testing.assert_allclose(
            tensors.unpack(row.outputs)["y"], x @ weights, rtol=1e-5, atol=1e-5
        )
    ran_by_second = sum(1 for r in again.values() if not by_drained(r.worker))
    assert ran_by_second > 0, "the second worker ran nothing"
