"""End to end: a model taken out of a live fleet. Its directory leaves the repository, a reload
unloads it, and `tffleet models unregister` takes it off the list: submissions of it are 404,
its ended jobs stay readable."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.models import build_mlp
from tests.e2e.test_versions import models_by_version, tffleet

pytestmark = pytest.mark.slow


def test_a_model_removed_from_the_repository_is_unregistered_once_no_worker_holds_it(
    fleet_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    build_mlp(models, name="kept", seed=1)
    build_mlp(models, name="gone", seed=2)
    fleet = fleet_factory(
        sqlite_url, models, devices="cpu:1", extra_env={"TFFLEET_MODEL_POLL_S": "1"}
    )
    fleet.start_api()
    fleet.start_worker(expect_models=2)
    x = np.ones((1, 8), dtype=np.float32).tolist()
    with fleet.http(timeout=60) as client:
        submitted = client.post("/v1/jobs", json={"model": "gone", "inputs": {"x": x}})
        assert submitted.status_code == 202, submitted.text
        ended = submitted.json()["id"]
        assert client.get(f"/v1/jobs/{ended}", params={"wait": 30}).json()["status"] == (
            "succeeded"
        )

    held = tffleet(fleet, "models", "unregister", "gone")
    assert held.returncode == 2, held.stdout
    assert "remove gone from the model repository on every worker host" in held.stderr

    shutil.rmtree(models / "gone")
    reload = tffleet(fleet, "models", "reload")
    assert reload.returncode == 0, reload.stderr
    fleet.wait_until(
        lambda: models_by_version(fleet)["gone", 1]["workers"] == [],
        "gone:1 drained and unloaded after the reload",
        60,
    )
    assert "`tffleet models unregister gone` takes gone off the fleet's list" in fleet.log("worker")

    done = tffleet(fleet, "models", "unregister", "gone")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "tffleet: unregistered gone:1\n"

    assert set(models_by_version(fleet)) == {("kept", 1)}
    with fleet.http(timeout=60) as client:
        refused = client.post("/v1/jobs", json={"model": "gone", "inputs": {"x": x}})
        assert refused.status_code == 404, refused.text
        assert "no model named 'gone' is registered; models: kept" in refused.text
        job = client.get(f"/v1/jobs/{ended}")
        assert (job.status_code, job.json()["status"]) == (200, "succeeded")
        # The console reads the ended job, and its overview no longer lists the model.
        assert client.get(f"/v1/console/jobs/{ended}").status_code == 200
        overview = client.get("/v1/console/overview")
        assert overview.status_code == 200, overview.text
        assert '"gone"' not in overview.text
