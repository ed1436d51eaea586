"""Worker faults with real processes: killed children and workers, and a poison job (one that
kills its child every time).

Every test ends with a full drain and the same check: each accepted job ended exactly once (it is
in a final state that no longer changes), with the model's own outputs, and none was lost. A
sweeper runs beside the fleet with short leases, so jobs of a dead child come back in seconds
(tests/e2e/faults.py; the fixtures are in conftest.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from tests.e2e.conftest import clean_database
from tests.e2e.faults import (
    CHILD_LINE,
    Expected,
    assert_each_ended_once,
    children,
    inputs,
    submit_all,
)
from tests.e2e.models import KILL_COLUMN, KILL_VALUE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


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


# (6) a poison job


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
