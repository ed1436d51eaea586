"""One big job spans every child, with real processes, and survives a child's SIGKILL.

A 16-sample job of a model whose batches hold 4 samples, on `--devices cpu:2`: the child that
claims it splits it into four parts (db/parts.py), and both children run parts at once. One of
them is killed mid-part; its main process takes the part back, a child runs it again alone,
and the job ends once, `succeeded`, with every sample's own outputs in order.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.faults import Jobs
from tests.e2e.models import SLEEP_COLUMN, build_faulty
from tffleet import tensors

# The fault tests' fleet (a sweeper beside it, short leases: `fault_fleet`) and view of the jobs
# table (`table_for`) are fixtures of conftest.py.

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SAMPLES, BATCH = 16, 4
# Each part's forward pass: long enough that the sibling child, woken for the backlog, claims a
# part before the first child has run them all, even on a loaded machine (at 0.6 s, a run beside
# other tests once saw one child run all four).
PART_S = 2.0


def running_parts(table: Jobs) -> dict[str, str]:
    """Running parts: id -> the worker running it."""
    with table.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, worker FROM jobs WHERE parent_id IS NOT NULL AND status = 'running'")
        ).all()
    return {row.id: row.worker for row in rows}


def pid_of(worker: str) -> int:
    return int(worker.split("/")[1])  # host/pid/device/... task ...


def test_a_split_job_runs_on_both_children_and_survives_one_being_killed(
    fault_fleet: Callable[..., Fleet], postgres_url: str, table_for, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    weights = build_faulty(models)
    (models / "faulty" / "model.toml").write_text(
        f"max_batch_size = {BATCH}\nbuckets = [{BATCH}]\n"
    )
    clean_database(postgres_url)
    fleet = fault_fleet(postgres_url, models, devices="cpu:2")
    table: Jobs = table_for(postgres_url)
    x = np.random.default_rng(5).normal(size=(SAMPLES, 4)).astype(np.float32)
    x[:, SLEEP_COLUMN] = PART_S

    with fleet.http(timeout=60) as client:
        response = client.post("/v1/jobs", json={"model": "faulty", "inputs": {"x": x.tolist()}})
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        table.wait_until(
            lambda: len({pid_of(w) for w in running_parts(table).values()}) == 2,
            "a part running on each child",
            60,
        )
        running = client.get(f"/v1/jobs/{job_id}").json()
        assert running["status"] == "running"
        assert running["progress"]["samples"] == SAMPLES

        victim = pid_of(next(iter(running_parts(table).values())))
        os.kill(victim, signal.SIGKILL)

        ended = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()
        while ended["status"] == "running":
            ended = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()

    assert ended["status"] == "succeeded", ended
    assert ended["progress"] == {"samples": SAMPLES, "samples_done": SAMPLES}
    row = table.rows([job_id])[job_id]
    assert row.attempts == 1
    np.testing.assert_allclose(tensors.unpack(row.outputs)["y"], x @ weights, rtol=1e-5, atol=1e-5)
    assert list(table.rows()) == [job_id], "the parts are gone once the job ended"
