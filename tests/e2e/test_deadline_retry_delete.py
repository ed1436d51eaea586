"""Cancel-After, retry and delete end to end: a real API, worker and sweeper over SQLite.

A job with `Cancel-After: 1` for a model no worker serves waits queued until the sweeper cancels
it; a 5-second job with `Cancel-After: 2` is canceled while its forward pass runs, and the result
that pass writes late is discarded. Retried, the second one runs again under its id and
succeeds; both are then deleted.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from db.migrate import upgrade
from tests.e2e.conftest import Fleet
from tests.e2e.models import SLEEP_COLUMN, build_faulty

pytestmark = pytest.mark.slow

SLOW_S = 5.0


def seconds(job: dict[str, Any], start: str, end: str) -> float:
    def parse(value: str) -> datetime:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))

    return (parse(job[end]) - parse(job[start])).total_seconds()


def wait_for(client: httpx.Client, job_id: str, status: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", params={"wait": 2}).json()
        if job["status"] == status:
            return job
        time.sleep(0.05)
    pytest.fail(f"job {job_id} is {job['status']}, not {status}, after {timeout_s} s: {job}")


def test_cancel_after_cancels_a_queued_and_a_running_job_then_retry_and_delete(
    fleet_factory: Any, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'deadline.db'}"
    upgrade(database_url)
    build_faulty(tmp_path / "models", name="slow")
    build_faulty(tmp_path / "unserved", name="held")
    fleet: Fleet = fleet_factory(
        database_url,
        tmp_path / "models",
        devices="cpu:1",
        extra_env={"TFFLEET_SWEEP_INTERVAL_S": "0.2"},
    )
    # Registered while the fleet starts: the command loads the model (TensorFlow, seconds) and
    # writes the database alone, never the API.
    held = str(tmp_path / "unserved" / "held" / "1")
    output = tmp_path / "register.log"
    with output.open("wb") as out:
        register = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "models", "register", held, "--name", "held"],
            env=fleet.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    fleet.start_api()
    fleet.start_worker()
    fleet.start_sweeper()
    assert register.wait(timeout=120) == 0, output.read_text(errors="replace")
    slow = np.zeros((1, 4), np.float32)
    slow[0, SLEEP_COLUMN] = SLOW_S

    with fleet.http(timeout=60) as client:
        # Queued: no worker serves `held`, so only the sweeper can end it.
        response = client.post(
            "/v1/jobs",
            json={"model": "held", "inputs": [[0, 0, 0, 0]]},
            headers={"Cancel-After": "1"},
        )
        assert response.status_code == 202, response.text
        queued = response.json()
        # Running: its forward pass takes 5 s, its deadline is 2 s after its submit.
        response = client.post(
            "/v1/jobs",
            json={"model": "slow", "inputs": slow.tolist()},
            headers={"Cancel-After": "2s"},
        )
        assert response.status_code == 202, response.text
        running = response.json()
        assert seconds(running, "created_at", "deadline_at") == pytest.approx(2)

        ended = wait_for(client, queued["id"], "canceled")
        assert ended["error"]["code"] == "deadline" and ended["started_at"] is None
        assert "before it ran" in ended["error"]["message"]
        ended = wait_for(client, running["id"], "canceled")
        assert ended["error"]["code"] == "deadline" and ended["started_at"] is not None
        assert "while running" in ended["error"]["message"]
        assert seconds(ended, "created_at", "finished_at") < SLOW_S
        # Its forward pass goes on to its end; the result it writes then is discarded. The
        # worker's task ends once that write is done (or refused).
        fleet.wait_until(lambda: "succeeded in" in fleet.log("worker"), "the pass's end", 30)
        late = client.get(f"/v1/jobs/{running['id']}").json()
        assert late["status"] == "canceled" and late["outputs"] is None

        # Retry: the same id runs again, with no deadline now, to its end.
        response = client.post(f"/v1/jobs/{running['id']}/retry")
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "queued" and response.json()["error"] is None
        done = wait_for(client, running["id"], "succeeded", timeout_s=60)
        assert done["attempts"] == 2 and done["outputs"] is not None and done["error"] is None
        assert client.post(f"/v1/jobs/{running['id']}/retry").status_code == 409

        # Delete: both are gone, a second delete finds nothing.
        for job in (queued, running):
            assert client.delete(f"/v1/jobs/{job['id']}").status_code == 204
            assert client.get(f"/v1/jobs/{job['id']}").status_code == 404
            assert client.delete(f"/v1/jobs/{job['id']}").status_code == 404
    assert "canceled past their deadline" in fleet.log("sweeper")
