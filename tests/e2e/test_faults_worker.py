"""Worker faults with real processes: killed children and workers, a poison job, a job over its
time limit, a cancel mid-run, a warm shutdown, and PostgreSQL going away.

Every test ends with a full drain and the same check: each accepted job ended exactly once (it is
in a final state that no longer changes), with the model's own outputs, and none was lost. A
sweeper runs beside the fleet with short leases, so jobs of a dead child come back in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from sqlalchemy import bindparam, select, text

from db.engine import make_engine
from db.migrate import upgrade
from db.models import Job
from tests.conftest import service_missing
from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.models import KILL_COLUMN, KILL_VALUE, SLEEP_COLUMN, build_faulty
from tffleet import tensors
from tffleet.broker import queue_for, queue_lists
from tffleet.cli.process_group import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

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
    "TFFLEET_MODEL_POLL_S": "1",  # a warm shutdown waits for the children's poll (5 s otherwise)
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


@pytest.fixture
def no_core_files() -> Iterator[None]:
    """The children these tests crash leave no core files (the limit is inherited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


@pytest.fixture
def fault_fleet(fleet_factory: Callable[..., Fleet], no_core_files: None) -> Callable[..., Fleet]:
    """Start an API, a worker and (unless sweeper=False) a sweeper, with FAST_RECOVERY."""

    def make(
        database_url: str, models: Path, *, devices: str, sweeper: bool = True, **env: str
    ) -> Fleet:
        fleet = fleet_factory(
            database_url, models, devices=devices, extra_env={**FAST_RECOVERY, **env}
        )
        # All three start at once: the API and the sweeper are up long before the worker's
        # children have loaded TensorFlow.
        fleet.start_api(wait=False)
        if sweeper:
            fleet.start_sweeper(wait=False)
        fleet.start_worker()
        if sweeper:
            fleet.wait_sweeper()
        return fleet

    return make


@pytest.fixture
def faulty(tmp_path: Path) -> tuple[Path, np.ndarray]:
    models = tmp_path / "models"
    return models, build_faulty(models)


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


def submit(client: httpx.Client, x: np.ndarray) -> str:
    r = client.post("/v1/jobs", json=body(x))
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


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


@pytest.fixture
def table_for() -> Iterator[Callable[[str], Jobs]]:
    opened: list[Jobs] = []

    def make(url: str) -> Jobs:
        opened.append(Jobs(url))
        return opened[-1]

    yield make
    for table in opened:
        table.close()


# (1) and (2): killed processes


def test_a_child_killed_mid_batch_under_load_loses_nothing_and_its_replacement_takes_its_device(
    fault_fleet, postgres_url: str, faulty, table_for
) -> None:
    models, weights = faulty
    clean_database(postgres_url)
    fleet = fault_fleet(postgres_url, models, devices="cpu:2")
    table = table_for(postgres_url)
    device, victim = children(fleet.log("worker"))[0]

    xs = inputs(500, seed=1, sleep_s=0.2)  # each forward pass takes 0.2 s
    ids: list[str] = []
    submitter = _Background(lambda: ids.extend(submit_all(fleet, xs)))
    victims = []
    for _ in range(3):  # a kill that lands between two batches is tried again, on the new child
        table.wait_until(
            lambda pid=victim: table.running_for(pid) > 0, f"{device} running a batch", 60
        )
        os.kill(victim, signal.SIGKILL)
        victims.append(victim)
        if table.running_for(victim) > 0:  # it died holding a batch
            break
        fleet.wait_until(lambda: len(children(fleet.log("worker"))) > len(victims) + 1, "child")
        device, victim = children(fleet.log("worker"))[-1]
    else:
        pytest.fail("no kill landed mid-batch")
    submitter.join()

    rows = assert_each_ended_once(table, dict(zip(ids, xs, strict=True)), weights)
    assert max(row.attempts for row in rows.values()) == 2
    # Every killed child was replaced by a new process on the same device, pinned the same way.
    want = len(victims) + 2
    fleet.wait_until(lambda: len(children(fleet.log("worker"))) == want, "the replacement")
    lines = CHILD_LINE.findall(fleet.log("worker"))
    assert [d for d, _, _ in lines[2:]] == [device] * len(victims), lines
    assert int(lines[-1][1]) not in victims
    assert {cuda for _, _, cuda in lines} == {"-1"}  # a CPU slot hides every GPU


def test_a_dead_childs_jobs_come_back_at_once_from_its_main_process_not_at_lease_expiry(
    fault_fleet, postgres_url: str, faulty, table_for
) -> None:
    # A lease far longer than the test, and no sweeper: only the worker's main process, which
    # sees its child die, can put the jobs back (worker/orphans.py).
    models, weights = faulty
    clean_database(postgres_url)
    fleet = fault_fleet(postgres_url, models, devices="cpu:2", sweeper=False, TFFLEET_LEASE_S="600")
    table = table_for(postgres_url)
    (_, victim), (_, survivor) = children(fleet.log("worker"))

    # Enough for each child to hold a batch; the victim's come back and run again one by one.
    xs = inputs(100, seed=5, sleep_s=0.3)
    ids = submit_all(fleet, xs)
    table.wait_until(lambda: table.running_for(victim) > 0, "the victim running a batch", 60)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    held = table.running_for(victim)
    table.wait_until(lambda: table.running_for(victim) == 0, "the dead child's jobs back", 30)
    back_s = time.monotonic() - killed_at
    print(f"a dead child's {held} jobs were back in the queue {back_s:.2f}s after the kill")

    rows = assert_each_ended_once(table, dict(zip(ids, xs, strict=True)), weights)
    # Each job the child held ran again, unless the commit it had sent as it died landed: then it
    # ended once, by the victim, as the database had it (nothing lost, nothing run twice).
    assert held > 0
    reran = [row for row in rows.values() if row.attempts == 2]
    landed = [r for r in rows.values() if r.attempts == 1 and f"/{victim}/" in (r.worker or "")]
    assert reran or landed
    assert f"child {victim} died holding" in fleet.log("worker")
    assert fleet.procs["worker"].poll() is None
    assert table.running_for(survivor) == 0


def test_a_worker_killed_whole_loses_nothing_and_a_second_worker_finishes_everything(
    fault_fleet, postgres_url: str, faulty, table_for
) -> None:
    models, weights = faulty
    clean_database(postgres_url)
    fleet = fault_fleet(postgres_url, models, devices="cpu:2")
    table = table_for(postgres_url)

    xs = inputs(300, seed=2, sleep_s=0.1)
    ids: list[str] = []
    submitter = _Background(lambda: ids.extend(submit_all(fleet, xs)))
    table.wait_until(
        lambda: table.count("succeeded") >= 20 and table.count("running") > 0,
        "some jobs done and a batch running",
        60,
    )
    worker = fleet.procs["worker"]
    fleet.stop("worker", sig=signal.SIGKILL)  # the main process and its children, at once
    assert worker.returncode == -signal.SIGKILL
    assert table.count("running") > 0, "the kill caught no batch"
    submitter.join()  # submissions go on while no worker runs

    fleet.start("worker2", "worker", "--log-level", "INFO")
    assert_each_ended_once(table, dict(zip(ids, xs, strict=True)), weights)
    assert children(fleet.log("worker2")), "the second worker did the rest"


# (6) a poison job, (7) a job over its time limit


def test_a_job_that_kills_its_child_every_time_fails_worker_lost_and_spares_the_others(
    fault_fleet, postgres_url: str, faulty, table_for
) -> None:
    models, weights = faulty
    clean_database(postgres_url)
    fleet = fault_fleet(postgres_url, models, devices="cpu:2", TFFLEET_MAX_ATTEMPTS="2")
    table = table_for(postgres_url)

    xs = inputs(120, seed=3, sleep_s=0.05)
    poison = inputs(1, seed=4, sleep_s=0.05)[0]
    poison[-1, KILL_COLUMN] = KILL_VALUE
    everything = [*xs[:60], poison, *xs[60:]]  # submitted together: it shares batches
    ids = submit_all(fleet, everything, concurrency=8)
    poison_id = ids[60]

    expected: dict[str, Expected] = dict(zip(ids, everything, strict=True))
    expected[poison_id] = "failed:worker_lost"
    rows = assert_each_ended_once(table, expected, weights)
    assert rows[poison_id].attempts == 2
    assert fleet.log("worker").count("poison job") == 2
    # Each crashed child was replaced, on the same devices; the worker itself lives on.
    fleet.wait_until(lambda: len(children(fleet.log("worker"))) == 4, "two replacement children")
    assert {device for device, _ in children(fleet.log("worker"))} == {"cpu:0", "cpu:1"}
    assert fleet.procs["worker"].poll() is None


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


@dataclass
class PrivatePostgres:
    """A PostgreSQL server of the test's own, to stop and start at will (never the shared one)."""

    bin: Path
    root: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:  # postgres refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{args[0]} failed: {result.stdout}{result.stderr}{tail}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.root / "data"), "-A", "trust", "-U", "postgres",
                  "-E", "UTF8", "--no-sync", "--no-instructions")  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"),
                  "-o", options, "-w", "-t", "30", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", mode, "-w", "-t", "30", "stop")


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = _postgres_bin()
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


class _Background:
    """Run a function in a thread; `join` re-raises what it raised."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._error: BaseException | None = None

        def target() -> None:
            try:
                fn()
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join(timeout=120)
        if self._error is not None:
            raise self._error
