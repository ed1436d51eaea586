"""Several hosts, each with its own address and host name, sharing only Redis and PostgreSQL
(tests/e2e/hosts.py): an API host, a sweeper host and worker hosts. Under a steady load one
worker host dies whole, SIGKILL to every process it runs, and a new one joins: every accepted
job ends `succeeded` exactly once with the model's outputs, the jobs the dead host was running
come back and run elsewhere once their leases expire, and the live hosts take the load.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.hosts import Cluster, Host, JobsTable, open_cluster
from tests.e2e.models import SLEEP_COLUMN, build_faulty
from tffleet import tensors

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE_S = 6
FAST_RECOVERY = {
    "TFFLEET_LEASE_S": str(LEASE_S),
    "TFFLEET_SWEEP_INTERVAL_S": "1",
    "TFFLEET_MODEL_POLL_S": "1",
    "TFFLEET_REPUBLISH_AFTER_S": "3",
    "TFFLEET_MAX_ATTEMPTS": "3",
}
RATE = 30  # jobs submitted per second
LOAD_S = 10  # at least, and until the new host has served 3 s (the longer, as a rule)
FORWARD_PASS_S = 0.3  # each batch holds its child this long: a kill finds batches running
RECOVERY_LIMIT_S = 60  # hang detection only: leases of 6 s make it a few seconds


@pytest.fixture
def weights(tmp_path: Path) -> np.ndarray:
    return build_faulty(tmp_path / "models")


@pytest.fixture
def cluster(tmp_path: Path, weights: np.ndarray) -> Iterator[Cluster]:
    with open_cluster(tmp_path, tmp_path / "models", env=FAST_RECOVERY) as made:
        yield made


@pytest.fixture
def table(cluster: Cluster) -> Iterator[JobsTable]:
    opened = JobsTable(cluster.database_url)
    yield opened
    opened.close()


class Load:
    """Submits one job every 1/RATE s from a thread of its own (never waiting for the answers
    before the next one), until stopped; keeps each accepted job's inputs by id."""

    def __init__(self, cluster: Cluster, *, rate: float, seed: int) -> None:
        self._cluster = cluster
        self._rate = rate
        self._rng = np.random.default_rng(seed)
        self.accepted: dict[str, np.ndarray] = {}
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the load did not stop"

    def _inputs(self) -> np.ndarray:
        x = self._rng.normal(size=(int(self._rng.integers(1, 4)), 4)).astype(np.float32)
        x[:, SLEEP_COLUMN] = FORWARD_PASS_S
        return x

    async def _run(self) -> None:
        async with self._cluster.ahttp(timeout=60) as client:
            pending: set[asyncio.Task[None]] = set()

            async def one(x: np.ndarray) -> None:
                try:
                    r = await client.post(
                        "/v1/jobs", json={"model": "faulty", "inputs": {"x": x.tolist()}}
                    )
                except Exception as exc:  # the assertion after the load names it
                    self.refused.append(f"{type(exc).__name__}: {exc}")
                    return
                if r.status_code == 202:
                    self.accepted[r.json()["id"]] = x
                else:
                    self.refused.append(f"{r.status_code} {r.text[:200]}")

            start = time.monotonic()
            sent = 0
            while not self._stop.is_set():
                task = asyncio.create_task(one(self._inputs()))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
                await asyncio.sleep(max(0.0, start + sent / self._rate - time.monotonic()))
            await asyncio.gather(*pending)


class Recovery:
    """Watches jobs from a thread: when they all left `running` (taken back) and when they all
    ended `succeeded`, in seconds since `since` (time.monotonic())."""

    def __init__(self, table: JobsTable, ids: list[str], *, since: float) -> None:
        self._table, self._ids, self._since = table, ids, since
        self.back_s: float | None = None
        self.done_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set() and self.done_s is None:
            rows = self._table.rows("id = ANY(:ids)", ids=self._ids).values()
            now = time.monotonic() - self._since
            if self.back_s is None and all(row.status != "running" for row in rows):
                self.back_s = now
            if all(row.status == "succeeded" for row in rows):
                self.done_s = now
            self._stop.wait(0.1)

    def result(self, timeout_s: float) -> tuple[float, float]:
        self._thread.join(max(0.0, timeout_s))
        self._stop.set()
        self._thread.join()
        if self.back_s is None or self.done_s is None:
            pytest.fail(
                f"the dead host's jobs were not done within {RECOVERY_LIMIT_S}s of the kill "
                f"(back in the queue after {self.back_s}s)"
            )
        return self.back_s, self.done_s


def running_on(cluster: Cluster, table: JobsTable, host: Host) -> list[str]:
    rows = table.rows("status = 'running'")
    return [i for i, row in rows.items() if cluster.host_of(row.worker) == host.name]


def kill_mid_batch(cluster: Cluster, table: JobsTable, host: Host) -> list[str]:
    """SIGKILL the whole host while it runs a batch; returns the jobs it held then.

    It is frozen first (SIGSTOP to each of its process groups), so what it held is known before
    it dies: a host that froze, then lost its power."""
    for _ in range(50):
        cluster.wait_until(
            lambda: bool(running_on(cluster, table, host)), f"{host.name} running a batch"
        )
        host.signal(signal.SIGSTOP)
        time.sleep(0.3)  # a commit it had sent lands now
        held = running_on(cluster, table, host)
        if held:
            host.kill()
            return held
        host.signal(signal.SIGCONT)
    pytest.fail(f"{host.name} was never caught holding a batch")


def test_a_worker_host_killed_whole_under_load_loses_nothing_and_the_other_hosts_take_over(
    cluster: Cluster, table: JobsTable, weights: np.ndarray
) -> None:
    api, sweeper = cluster.add_host("api"), cluster.add_host("sweeper")
    w1, w2, w3 = cluster.add_host("w1"), cluster.add_host("w2"), cluster.add_host("w3")
    if cluster.own_hostnames:
        assert [cluster.hostname_on(h) for h in (api, w1, w2)] == ["api", "w1", "w2"]
    if cluster.mode == "netns":  # PostgreSQL is on the test machine's loopback, not the hosts'
        reach = "import socket; socket.create_connection(('127.0.0.1', 5432), timeout=2)"
        with pytest.raises(RuntimeError, match="ConnectionRefusedError"):
            cluster.python(w1, reach)
    # The workers load TensorFlow while the API and the sweeper get ready.
    cluster.start_api(api, wait=False)
    cluster.start_worker(w1, "cpu:2")
    cluster.start_worker(w2, "cpu:1")
    cluster.wait_api()
    cluster.start_sweeper(sweeper)
    cluster.wait_workers(w1, 2)
    cluster.wait_workers(w2, 1)
    if cluster.own_hostnames:
        assert {row.host for row in cluster.presence()} == {"w1", "w2"}

    load = Load(cluster, rate=RATE, seed=1)
    load_started = time.monotonic()
    load.start()
    try:
        cluster.wait_until(lambda: table.count("succeeded") >= 2 * RATE, "a steady state", 120)
        victims = kill_mid_batch(cluster, table, w1)
        killed_at, killed_db = time.monotonic(), table.now()
        recovery = Recovery(table, victims, since=killed_at)
        print(f"w1 killed holding {len(victims)} running jobs")

        cluster.start_worker(w3, "cpu:1")
        cluster.wait_workers(w3, 1)
        joined_at = time.monotonic()
        while time.monotonic() < max(load_started + LOAD_S, joined_at + 3):
            time.sleep(0.2)
    finally:
        load.stop()
    assert not load.refused, load.refused[:10]
    print(f"{len(load.accepted)} jobs accepted in {time.monotonic() - load_started:.1f}s")

    # The dead host's jobs came back (their leases expired; the sweeper requeued them) and ended.
    back_s, done_s = recovery.result(RECOVERY_LIMIT_S - (time.monotonic() - killed_at))
    print(
        f"recovery: w1's {len(victims)} jobs were back in the queue {back_s:.1f}s and done "
        f"{done_s:.1f}s after the kill (TFFLEET_LEASE_S={LEASE_S})"
    )

    rows = table.drain(list(load.accepted), timeout_s=120)
    assert set(rows) == set(load.accepted), "jobs appeared or vanished"
    time.sleep(1.5)  # a late or duplicate writer would show here
    again = table.rows()
    for job_id, x in load.accepted.items():
        row, was = again[job_id], rows[job_id]
        assert (row.status, row.outputs, row.finished_at, row.worker) == (
            was.status,
            was.outputs,
            was.finished_at,
            was.worker,
        ), f"job {job_id} changed after it ended"
        assert row.status == "succeeded", (job_id, row.status, row.error_code, row.attempts)
        np.testing.assert_allclose(
            tensors.unpack(row.outputs)["y"], x @ weights, rtol=1e-5, atol=1e-5
        )
        # Once each: the dead host's jobs ran a second time, elsewhere; no other job ran twice.
        assert row.attempts == (2 if job_id in victims else 1), (job_id, row.attempts, row.worker)

    # What the API shows: each job's outputs and the worker that ran it, on which host.
    shown = _shown(cluster, list(load.accepted))
    ran_on: dict[str, str | None] = {}
    for job_id, job in shown.items():
        assert job["status"] == "succeeded" and job["attempts"] == again[job_id].attempts
        assert job["worker"] == again[job_id].worker
        np.testing.assert_allclose(
            np.asarray(job["outputs"]["y"], dtype=np.float32),
            load.accepted[job_id] @ weights,
            rtol=1e-5,
            atol=1e-5,
        )
        ran_on[job_id] = cluster.host_of(job["worker"])
    hosts = {name: sum(1 for h in ran_on.values() if h == name) for name in ("w1", "w2", "w3")}
    print(f"jobs by host: {hosts}")
    assert set(ran_on.values()) <= {"w1", "w2", "w3"}, set(ran_on.values())
    assert {ran_on[job_id] for job_id in victims} <= {"w2", "w3"}
    finished_later = [i for i, row in again.items() if row.finished_at > killed_db]
    assert {ran_on[i] for i in finished_later} <= {"w2", "w3"}, "the dead host finished a job"
    assert hosts["w1"] > 0 and hosts["w2"] > 0 and hosts["w3"] > 0, hosts

    # The fleet's view: the dead host's children are gone from the live workers.
    def live_hosts() -> set[str | None]:
        with cluster.http(timeout=10) as client:
            (model,) = client.get("/v1/models").json()["models"]
        return {cluster.host_of(worker["worker"]) for worker in model["workers"]}

    cluster.wait_until(lambda: live_hosts() == {"w2", "w3"}, "only w2 and w3 live", 30)
    for host in (api, sweeper, w2, w3):
        for name, proc in host.procs.items():
            assert proc.poll() is None, f"{name} on {host.name} exited"
    if cluster.forwarder is not None:  # every host reached PostgreSQL through the bridge
        assert cluster.forwarder.connections > 0


def _shown(cluster: Cluster, ids: list[str]) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    with cluster.http(timeout=60) as client:
        for start in range(0, len(ids), 500):
            r = client.post("/v1/jobs/status", json={"ids": ids[start : start + 500]})
            assert r.status_code == 200, r.text
            shown.update((job["id"], job) for job in r.json()["jobs"])
    return shown
