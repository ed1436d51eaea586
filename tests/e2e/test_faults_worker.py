"""Worker faults with real processes: a job over its time limit, a cancel mid-run, a warm
shutdown, and PostgreSQL going away.

Every test ends with a full drain and the same check: each accepted job ended exactly once (it is
in a final state that no longer changes), with the model's own outputs, and none was lost. A
sweeper runs beside the fleet with short leases (tests/e2e/faults.py; the fixtures are in
conftest.py). The killed processes are in test_faults_kill.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from db.migrate import upgrade
from tests.conftest import service_missing
from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.faults import (
    LEASE_S,
    Expected,
    assert_each_ended_once,
    body,
    children,
    inputs,
    submit_all,
)
from tests.e2e.models import build_faulty
from tests.services import PrivatePostgres, postgres_bin
from tffleet.broker import queue_for, queue_lists
from tffleet.cli.process_group import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def submit(client: httpx.Client, x: np.ndarray) -> str:
    r = client.post("/v1/jobs", json=body(x))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


# (7) a job over its time limit


def test_a_job_over_its_time_limit_fails_timeout_and_the_device_keeps_serving(
    fault_fleet, postgres_url: str, tmp_path: Path, table_for
) -> None:
    models = tmp_path / "models"
    weights = build_faulty(models, timeout_s=2)
    clean_database(postgres_url)
    fleet = fault_fleet(postgres_url, models, devices="cpu:1")
    table = table_for(postgres_url)
    ((_, first_pid),) = children(fleet.log("worker"))
    expected: dict[str, Expected] = {}

    with fleet.http(timeout=30) as client:
        # Alone: it fails `timeout` on its first attempt, in about its time limit.
        slow = inputs(1, seed=5, sleep_s=60)[0]
        started = time.monotonic()
        slow_id = submit(client, slow)
        expected[slow_id] = "failed:timeout"
        table.drain([slow_id], timeout_s=30)
        assert time.monotonic() - started < 15
        row = table.rows([slow_id])[slow_id]
        assert (row.status, row.error_code, row.attempts) == ("failed", "timeout", 1)
        job = client.get(f"/v1/jobs/{slow_id}").json()
        assert job["error"]["code"] == "timeout" and "2s" in job["error"]["message"]

        # In a batch: the others go back to the queue and run alone; only the slow one fails.
        batch = [*inputs(3, seed=6), inputs(1, seed=7, sleep_s=60)[0]]
        r = client.post("/v1/jobs", json={"jobs": [body(x) for x in batch]})
        assert r.status_code == 202, r.text
        batch_ids = [job["id"] for job in r.json()["jobs"]]
        expected.update(zip(batch_ids, batch, strict=True))
        expected[batch_ids[-1]] = "failed:timeout"

        # Meanwhile and after: the device serves everything else.
        later = inputs(20, seed=8)
        expected.update((submit(client, x), x) for x in later)

    rows = assert_each_ended_once(table, expected, weights)
    assert [rows[i].attempts for i in batch_ids] == [2, 2, 2, 2]
    log = fleet.log("worker")
    assert "ran past its 2s time limit" in log
    assert fleet.procs["worker"].poll() is None
    replaced = children(log)
    assert len(replaced) >= 3 and {device for device, _ in replaced} == {"cpu:0"}
    assert replaced[-1][1] != first_pid


# (9a) cancel, and a warm shutdown


def test_a_job_canceled_while_claimed_or_running_ends_canceled_without_its_late_result(
    fault_fleet, postgres_url: str, faulty, table_for
) -> None:
    models, weights = faulty
    clean_database(postgres_url)
    fleet = fault_fleet(postgres_url, models, devices="cpu:1")
    table = table_for(postgres_url)
    expected: dict[str, Expected] = {}

    with fleet.http(timeout=30) as client:
        slow_id = submit(client, inputs(1, seed=9, sleep_s=3)[0])
        table.wait_until(lambda: table.count("running") == 1, "the slow job running", 30)
        r = client.post(f"/v1/jobs/{slow_id}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "canceled", r.text
        expected[slow_id] = "canceled"
        canceled_at = table.rows([slow_id])[slow_id].finished_at
        # Its batch ends (the task that claimed it logs its end), and its result is fenced out.
        fleet.wait_until(lambda: "{'claimed': 1," in fleet.log("worker"), "the batch's end", 30)
        row = table.rows([slow_id])[slow_id]
        assert (row.status, row.outputs, row.finished_at) == ("canceled", None, canceled_at)

    jitter = random.Random(0)

    async def race(xs: list[np.ndarray]) -> None:
        # Cancel each job right after submitting it: before, during or after its claim.
        async with fleet.ahttp(timeout=30) as client:

            async def one(x: np.ndarray) -> None:
                r = await client.post("/v1/jobs", json=body(x))
                assert r.status_code == 202, r.text
                job_id = r.json()["id"]
                await asyncio.sleep(jitter.uniform(0, 0.05))
                c = await client.post(f"/v1/jobs/{job_id}/cancel")
                assert c.status_code in (200, 409), c.text
                expected[job_id] = "canceled" if c.status_code == 200 else x

            await asyncio.gather(*(one(x) for x in xs))

    asyncio.run(race(inputs(100, seed=10, sleep_s=0.02)))

    rows = assert_each_ended_once(table, expected, weights)
    outcomes = {row.status for row in rows.values()}
    assert "canceled" in outcomes, outcomes


def test_sigterm_lets_the_running_batch_finish_and_leaves_queued_jobs_for_the_next_worker(
    fault_fleet, postgres_url: str, faulty, table_for
) -> None:
    models, weights = faulty
    clean_database(postgres_url)
    # No sweeper: nothing but the worker itself may finish the running job.
    fleet = fault_fleet(postgres_url, models, devices="cpu:1", sweeper=False)
    table = table_for(postgres_url)

    with fleet.http(timeout=30) as client:
        running = inputs(1, seed=11, sleep_s=3)[0]
        running_id = submit(client, running)
        table.wait_until(lambda: table.count("running") == 1, "the job running", 30)
        waiting = inputs(1, seed=12)[0]
        waiting_id = submit(client, waiting)

    worker = fleet.procs["worker"]
    os.kill(worker.pid, signal.SIGTERM)  # the main process only, as `docker stop` does
    assert worker.wait(timeout=30) == 0
    row = table.rows([running_id])[running_id]
    assert (row.status, row.attempts) == ("succeeded", 1), "the batch was cut short"
    assert table.rows([waiting_id])[waiting_id].status == "queued"

    fleet.start_worker()  # its message went back to Redis at shutdown
    assert_each_ended_once(table, {running_id: running, waiting_id: waiting}, weights)


# (5) PostgreSQL goes away


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = postgres_bin()
    if bindir is None:
        service_missing("initdb (a PostgreSQL server to stop and restart)", FileNotFoundError())
    root = Path(tempfile.mkdtemp(prefix="tffleet-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres")
    server = PrivatePostgres(bin=bindir, root=root, port=free_port())  # type: ignore[arg-type]
    try:
        server.init()
        server.start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        service_missing("a private PostgreSQL server", exc)
    yield server
    with contextlib.suppress(RuntimeError):  # already stopped
        server.stop("immediate")
    shutil.rmtree(root, ignore_errors=True)


def _received(fleet: Fleet) -> int:
    return len(re.findall(r"Task \S+ received", fleet.log("worker")))


def _queued_messages(redis_url: str) -> int:
    broker = redis.Redis.from_url(redis_url)
    try:
        return sum(int(broker.llen(name)) for name in queue_lists(queue_for("faulty")))
    finally:
        broker.close()


def _wait_idle(fleet: Fleet, redis_url: str) -> int:
    """Wait until the queue is empty and the worker took no message for a second; returns how
    many it has taken."""
    seen, since = _received(fleet), time.monotonic()
    deadline = since + 30
    while time.monotonic() - since < 1 or _queued_messages(redis_url):
        assert time.monotonic() < deadline, "the worker never went idle"
        time.sleep(0.1)
        if _received(fleet) != seen:
            seen, since = _received(fleet), time.monotonic()
    return seen


def test_postgres_down_at_submit_is_503_with_nothing_published_and_workers_survive_a_restart(
    fault_fleet, private_postgres: PrivatePostgres, faulty, table_for, redis_url
) -> None:
    models, weights = faulty
    pg = private_postgres
    upgrade(pg.url)
    fleet = fault_fleet(pg.url, models, devices="cpu:1")
    table = table_for(pg.url)
    expected: dict[str, Expected] = {}
    first = children(fleet.log("worker"))

    # Healthy, then drained and idle (wake-ups of jobs a top-up took are consumed too): from
    # here on nothing should reach the worker.
    xs = inputs(30, seed=13)
    expected.update(zip(submit_all(fleet, xs), xs, strict=True))
    table.drain(list(expected))
    received = _wait_idle(fleet, redis_url)

    pg.stop()
    with fleet.http(timeout=30) as client:
        for x in inputs(5, seed=14):
            r = client.post("/v1/jobs", json=body(x))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "unavailable"
    time.sleep(1.5)
    assert _queued_messages(redis_url) == 0
    assert _received(fleet) == received, "a wake-up went out for a job that was not stored"

    pg.start()
    later = inputs(30, seed=15)
    expected.update(zip(_submit_retrying_503(fleet, later), later, strict=True))

    # Down again while batches run: their writes fail, the tasks retry, the leases come back.
    slow = inputs(30, seed=16, sleep_s=0.2)
    slow_ids = submit_all(fleet, slow)
    expected.update(zip(slow_ids, slow, strict=True))
    table.wait_until(lambda: table.count("running") > 0, "a batch running", 30)
    pg.stop()
    time.sleep(LEASE_S)
    pg.start()

    assert_each_ended_once(table, expected, weights)
    assert fleet.procs["worker"].poll() is None
    assert children(fleet.log("worker")) == first, "a child died"
    assert "Retry in" in fleet.log("worker")  # the database error was retried, not dropped


def _submit_retrying_503(fleet: Fleet, xs: list[np.ndarray]) -> list[str]:
    """Submit each job, again on 503 (the API's pool finds its connections dead once)."""
    ids = []
    with fleet.http(timeout=30) as client:
        for x in xs:
            for _ in range(50):
                r = client.post("/v1/jobs", json=body(x))
                if r.status_code != 503:
                    break
                time.sleep(0.2)
            assert r.status_code == 202, r.text
            ids.append(str(r.json()["id"]))
    return ids
