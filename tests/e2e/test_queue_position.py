"""`queue_position` end to end: a real API and worker over SQLite, one child, a slow model that
runs one job per forward pass (`max_batch_size = 1`). Seven 1-second jobs are submitted at once;
the last one's position, polled, counts down as the jobs ahead of it run, reaches 0, and then it
runs and succeeds.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from tests.e2e.conftest import SharedFleet
from tests.e2e.models import SLEEP_COLUMN

pytestmark = pytest.mark.slow

JOBS = 7
SLOW_S = 1.0


def test_queue_position_counts_down_to_zero_as_the_jobs_ahead_run(
    shared_fleet: SharedFleet,
) -> None:
    fleet = shared_fleet.fleet  # its model `slow` says `max_batch_size = 1`; no other test uses it
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
