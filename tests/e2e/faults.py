"""What the worker fault tests share (test_faults_kill.py, test_faults_worker.py, and
test_split.py): the fleet's short leases, the jobs they submit, and their view of the jobs table.

Their fixtures (`no_core_files`, `fault_fleet`, `faulty`, `table_for`) are in conftest.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from sqlalchemy import bindparam, select, text

from db.engine import make_engine
from db.models import Job
from tests.e2e.models import SLEEP_COLUMN
from tffleet import tensors

if TYPE_CHECKING:
    from tests.e2e.conftest import Fleet

LEASE_S = 3.0
FINAL = ("succeeded", "failed", "canceled")
Expected = np.ndarray | str  # a successful job's inputs, or "failed:<code>" / "canceled"
CHILD_LINE = re.compile(r"child (\S+) \(pid (\d+), CUDA_VISIBLE_DEVICES=(\S+)\) loaded")


# The fleet: API, worker, and a sweeper with short leases, so jobs of a dead child come back
# within seconds.

FAST_RECOVERY = {
    "TFFLEET_LEASE_S": str(LEASE_S),
    "TFFLEET_SWEEP_INTERVAL_S": "0.5",
    "TFFLEET_REPUBLISH_AFTER_S": "2",
    "TFFLEET_MAX_ATTEMPTS": "3",
    "TFFLEET_MODEL_POLL_S": "1",  # children rescan and report every second (5 s by default)
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def children(log: str) -> list[tuple[str, int]]:
    """(device, pid) of every child that loaded its models, in the order they did."""
    return [(device, int(pid)) for device, pid, _ in CHILD_LINE.findall(log)]


# Jobs


def inputs(n: int, *, seed: int, sleep_s: float = 0.0) -> list[np.ndarray]:
    """n jobs of 1 to 3 samples; each forward pass holding one sleeps `sleep_s`."""
    rng = np.random.default_rng(seed)
    xs = []
    for _ in range(n):
        x = rng.normal(size=(int(rng.integers(1, 4)), 4)).astype(np.float32)
        x[:, SLEEP_COLUMN] = sleep_s
        xs.append(x)
    return xs


def body(x: np.ndarray) -> dict[str, Any]:
    return {"model": "faulty", "inputs": {"x": x.tolist()}}


async def _submit_all(fleet: Fleet, xs: list[np.ndarray], concurrency: int) -> list[str]:
    limit = asyncio.Semaphore(concurrency)
    async with fleet.ahttp(timeout=60) as client:

        async def one(x: np.ndarray) -> str:
            async with limit:
                r = await client.post("/v1/jobs", json=body(x))
                assert r.status_code == 202, r.text
                return str(r.json()["id"])

        return list(await asyncio.gather(*(one(x) for x in xs)))


def submit_all(fleet: Fleet, xs: list[np.ndarray], *, concurrency: int = 16) -> list[str]:
    return asyncio.run(_submit_all(fleet, xs, concurrency))


class Jobs:
    """The test's view of the jobs table."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url, pool_pre_ping=True)  # outlives server restarts

    def close(self) -> None:
        self.engine.dispose()

    def rows(self, ids: list[str] | None = None) -> dict[str, Any]:
        query = select(
            Job.id,
            Job.status,
            Job.error_code,
            Job.attempts,
            Job.outputs,
            Job.finished_at,
            Job.worker,
        )
        params = {}
        if ids is not None:
            query = query.where(Job.id.in_(bindparam("ids", expanding=True)))
            params = {"ids": ids}
        with self.engine.connect() as conn:
            return {row.id: row for row in conn.execute(query, params)}

    def running_for(self, pid: int) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.scalar(
                    text("SELECT count(*) FROM jobs WHERE status = 'running' AND worker LIKE :p"),
                    {"p": f"%/{pid}/%"},
                )
                or 0
            )

    def count(self, status: str) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.scalar(text("SELECT count(*) FROM jobs WHERE status = :s"), {"s": status}) or 0
            )

    def wait_until(self, check: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
            time.sleep(0.1)

    def drain(self, ids: list[str], *, timeout_s: float = 60) -> dict[str, Any]:
        def ended() -> bool:
            return all(row.status in FINAL for row in self.rows(ids).values())

        deadline = time.monotonic() + timeout_s
        while not ended():
            if time.monotonic() > deadline:
                rows = self.rows(ids)
                stuck = {
                    i: (r.status, r.attempts) for i, r in rows.items() if r.status not in FINAL
                }
                pytest.fail(f"{len(stuck)} jobs did not end within {timeout_s}s: {stuck}")
            time.sleep(0.25)
        return self.rows(ids)


def assert_each_ended_once(
    table: Jobs, expected: dict[str, Expected], weights: np.ndarray, *, settle_s: float = 1.5
) -> dict[str, Any]:
    """Every accepted job, and no other, ended once: as expected, and it stays that way."""
    first = table.drain(list(expected))
    assert set(table.rows()) == set(expected), "jobs appeared or vanished"
    time.sleep(settle_s)  # a late writer (a stale lease, a duplicate message) would show here
    again = table.rows()
    for job_id, want in expected.items():
        row = again[job_id]
        was = first[job_id]
        assert (row.status, row.error_code, row.outputs, row.finished_at) == (
            was.status,
            was.error_code,
            was.outputs,
            was.finished_at,
        ), f"job {job_id} changed after it ended"
        if isinstance(want, np.ndarray):
            assert row.status == "succeeded", (job_id, row.status, row.error_code, row.attempts)
            np.testing.assert_allclose(
                tensors.unpack(row.outputs)["y"], want @ weights, rtol=1e-5, atol=1e-5
            )
        elif want == "canceled":
            assert (row.status, row.outputs) == ("canceled", None), job_id
        else:
            status, code = want.split(":")
            assert (row.status, row.error_code, row.outputs) == (status, code, None), job_id
    return again
