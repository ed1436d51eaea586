"""`queue_position` end to end: a real API and worker over SQLite, one child, a slow model that
runs one job per forward pass (`max_batch_size = 1`). Seven 1-second jobs are submitted at once;
the last one's position, polled, counts down as the jobs ahead of it run, reaches 0, and then it
runs and succeeds.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from db.migrate import upgrade
from tests.e2e.conftest import Fleet
from tests.e2e.models import SLEEP_COLUMN, build_faulty

pytestmark = pytest.mark.slow

JOBS = 7
SLOW_S = 1.0


def test_queue_position_counts_down_to_zero_as_the_jobs_ahead_run(
    fleet_factory: Any, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'position.db'}"
    upgrade(database_url)
    build_faulty(tmp_path / "models", name="slow")
    (tmp_path / "models" / "slow" / "model.toml").write_text("max_batch_size = 1\n")
    fleet: Fleet = fleet_factory(database_url, tmp_path / "models", devices="cpu:1")
    fleet.start_api()
    fleet.start_worker()
    x = np.zeros((1, 4), np.float32)
    x[0, SLEEP_COLUMN] = SLOW_S
    job = {"model": "slow", "inputs": {"x": x.tolist()}}

    with fleet.http(timeout=30) as client:
        response = client.post("/v1/jobs", json={"jobs": [job] * JOBS})
        assert response.status_code == 202, response.text
        last = response.json()["jobs"][-1]
        seen = [last["queue_position"]]
        deadline = time.monotonic() + JOBS * SLOW_S + 20
        while last["status"] == "queued" and time.monotonic() < deadline:
            time.sleep(0.1)
            last = client.get(f"/v1/jobs/{last['id']}").json()
            if last["status"] == "queued":
                seen.append(last["queue_position"])
        done = client.get(f"/v1/jobs/{last['id']}", params={"wait": 10}).json()

    print(f"positions seen: {seen}")
    assert seen[0] >= 4, seen  # at most the first job and the one claimed ahead had left
    assert all(a >= b for a, b in itertools.pairwise(seen)), seen  # never moves back
    assert seen[-1] == 0, seen
    assert len(set(seen)) >= 3, seen  # it counted down on the way, not at once
    assert last["status"] != "queued" and last["queue_position"] is None, last
    assert done["status"] == "succeeded", done
