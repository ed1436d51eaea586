"""End to end: a job followed through its event stream (`Client.events`) from queued to
succeeded, with real API and worker processes and real TensorFlow."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp
from tffleet import Client, Job

pytestmark = pytest.mark.slow


def test_the_client_follows_a_job_from_queued_to_succeeded_with_its_outputs(
    fleet_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    model = build_mlp(models)
    fleet: Fleet = fleet_factory(sqlite_url, models, devices="cpu:1")
    registered = subprocess.run(
        [sys.executable, "-m", "tffleet.cli", "models", "register", str(models / "mlp" / "1")],
        env=fleet.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert registered.returncode == 0, registered.stderr
    fleet.start_api()
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    seen: list[Job] = []
    errors: list[BaseException] = []

    with Client(fleet.url, api_key=fleet.api_key) as client:
        job = client.submit("mlp", {"x": x})  # no worker yet: it waits, queued

        def follow() -> None:
            try:
                seen.extend(client.events(job.id))
            except BaseException as exc:
                errors.append(exc)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        fleet.start_worker()
        follower.join(timeout=60)

    assert not follower.is_alive() and not errors, errors
    statuses = [j.status for j in seen]
    # `running` lasts milliseconds here: the stream may see it or not.
    assert statuses in (["queued", "succeeded"], ["queued", "running", "succeeded"]), statuses
    assert seen[-1].outputs is not None
    np.testing.assert_allclose(seen[-1].outputs["output_0"], model(x), rtol=1e-5, atol=1e-6)
