"""End to end: model versions switch under load, models registered before any worker, workers
that serve a subset of the fleet's models or devices, and `tffleet models`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from db import registry
from db.engine import make_engine, make_sessionmaker
from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.models import build_mlp

pytestmark = pytest.mark.slow

FINISHED = ("succeeded", "failed", "canceled")


def models_by_version(fleet: Fleet) -> dict[tuple[str, int], dict[str, Any]]:
    listed = fleet.get("/v1/models").json()["models"]
    return {(m["name"], m["version"]): m for m in listed}


def devices(model: dict[str, Any], state: str = "loaded") -> list[str]:
    return sorted(w["device"] for w in model["workers"] if w["state"] == state)


def wait_all(client: httpx.Client, job_ids: list[str]) -> list[dict[str, Any]]:
    """Every job, once all have ended (bulk long-polls)."""
    deadline = time.monotonic() + 120
    jobs: dict[str, dict[str, Any]] = {}
    while True:
        pending = [i for i in job_ids if jobs.get(i, {}).get("status") not in FINISHED]
        if not pending:
            return [jobs[i] for i in job_ids]
        assert time.monotonic() < deadline, f"{len(pending)} jobs did not finish"
        for start in range(0, len(pending), 1000):
            found = client.post(
                "/v1/jobs/status", json={"ids": pending[start : start + 1000], "wait": 5}
            ).json()["jobs"]
            jobs.update({job["id"]: job for job in found})


def tffleet(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tffleet.cli", *args],
        env=fleet.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


class SteadyLoad:
    """Clients that submit jobs without a version, one after another, until stopped."""

    def __init__(self, fleet: Fleet, clients: int = 2) -> None:
        self.fleet = fleet
        self.submitted: list[tuple[str, int, np.ndarray]] = []  # (id, version, inputs)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with self.fleet.http(timeout=30) as client:
            while not self._stop.is_set():
                x = rng.normal(size=(int(rng.integers(1, 4)), 8)).astype(np.float32)
                r = client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": x.tolist()}})
                if r.status_code != 202:
                    self.errors.append(r.text)
                    continue
                self.submitted.append((r.json()["id"], r.json()["version"], x))
                time.sleep(0.01)

    def versions(self) -> set[int]:
        return {version for _, version, _ in self.submitted}

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def test_a_new_version_takes_over_under_steady_load_without_a_failed_job(
    fleet_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    clean_database(postgres_url)
    models = tmp_path / "models"
    first = build_mlp(models, seed=7)
    second = build_mlp(tmp_path / "elsewhere", seed=11)
    fleet = fleet_factory(
        postgres_url, models, devices="cpu:2", extra_env={"TFFLEET_MODEL_POLL_S": "0.5"}
    )
    fleet.start_api(wait=False)  # ready while the worker loads TensorFlow
    fleet.start_worker()

    with SteadyLoad(fleet) as load:
        fleet.wait_until(lambda: len(load.submitted) >= 50, "jobs of version 1")
        # Copied in file by file while the worker polls: it may see half a SavedModel first.
        shutil.copytree(tmp_path / "elsewhere" / "mlp" / "1", models / "mlp" / "2")
        fleet.wait_until(lambda: 2 in load.versions(), "submissions going to version 2", 120)
        fleet.wait_until(
            lambda: sum(v == 2 for _, v, _ in load.submitted) >= 50, "jobs of version 2"
        )

    assert load.errors == []
    with fleet.http(timeout=60) as client:
        done = wait_all(client, [job_id for job_id, _, _ in load.submitted])
    assert [job["status"] for job in done] == ["succeeded"] * len(done)
    by_id = sorted(zip(load.submitted, done, strict=True), key=lambda pair: pair[0][0])
    versions = [job["version"] for _, job in by_id]
    assert versions == sorted(versions), "a job went to version 1 after version 2 took over"
    for (_, version, x), job in by_id:
        expected = (first if version == 1 else second)(x)
        np.testing.assert_allclose(job["outputs"]["output_0"], expected, rtol=1e-5, atol=1e-6)

    # Version 1 drained: retired, then unloaded by both children.
    def unloaded() -> bool:
        listed = models_by_version(fleet)
        return listed["mlp", 1]["workers"] == [] and devices(listed["mlp", 2]) == [
            "cpu:0",
            "cpu:1",
        ]

    fleet.wait_until(unloaded, "version 1 unloaded everywhere", 60)
    listed = models_by_version(fleet)
    assert (listed["mlp", 1]["retired"], listed["mlp", 1]["latest"]) == (True, False)
    assert (listed["mlp", 2]["served"], listed["mlp", 2]["latest"]) == (True, True)
    assert fleet.log("worker").count("unloaded mlp:1: drained") == 2
    with fleet.http() as client:
        refused = client.post(
            "/v1/jobs", json={"model": "mlp", "version": 1, "inputs": [[0.0] * 8]}
        )
    assert refused.status_code == 404
    assert "retired" in refused.json()["error"]["message"]


def test_a_registered_model_takes_jobs_before_any_worker_and_runs_them_once_one_starts(
    fleet_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    model = build_mlp(models)
    fleet = fleet_factory(sqlite_url, models, devices="cpu:1")
    fleet.start_api(wait=False)  # ready while the commands load TensorFlow; nothing cached yet

    nowhere = tffleet(fleet, "models", "register", str(models / "nope" / "1"))
    assert nowhere.returncode == 2
    assert "is not a directory" in nowhere.stderr
    registered = tffleet(fleet, "models", "register", str(models / "mlp" / "1"))
    assert registered.returncode == 0, registered.stderr
    assert "registered mlp:1 (saved_model); inputs x float32[?,8]" in registered.stdout

    fleet.wait_api()
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    with fleet.http(timeout=60) as client:
        wrong = client.post("/v1/jobs", json={"model": "mlp", "inputs": [[1.0, 2.0]]})
        assert wrong.status_code == 422, wrong.text
        submitted = client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": x.tolist()}})
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]

        waiting = models_by_version(fleet)["mlp", 1]
        assert (waiting["served"], waiting["latest"], waiting["workers"]) == (False, True, [])
        assert waiting["queued"] == 1
        listing = tffleet(fleet, "models", "list")
        assert listing.returncode == 0, listing.stderr
        assert "no live worker, latest" in listing.stdout

        fleet.start_worker()
        job = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()
    assert job["status"] == "succeeded", job
    np.testing.assert_allclose(job["outputs"]["output_0"], model(x), rtol=1e-5, atol=1e-6)
    assert "serving, latest" in tffleet(fleet, "models", "list").stdout


def test_a_worker_serves_its_models_on_their_devices_and_reloads_on_request(
    fleet_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    build_mlp(models, name="a", seed=1)
    (models / "a" / "model.toml").write_text('devices = ["cpu:1"]\n')
    build_mlp(models, name="b", seed=2)
    build_mlp(tmp_path / "elsewhere", name="a", seed=3)
    # A long poll: only `tffleet models reload` makes the worker notice a new version soon.
    fleet = fleet_factory(
        sqlite_url, models, devices="cpu:2", extra_env={"TFFLEET_MODEL_POLL_S": "60"}
    )
    engine = make_engine(sqlite_url)
    with make_sessionmaker(engine).begin() as session:  # as `tffleet models register` would
        registry.register(
            session=session,
            name="b",
            version=1,
            format="saved_model",
            inputs={"x": {"dtype": "float32", "shape": [-1, 8]}},
            outputs={"output_0": {"dtype": "float32", "shape": [-1, 3]}},
        )
    engine.dispose()
    fleet.start_api(wait=False)  # ready while the worker loads TensorFlow
    fleet.start("worker", "worker", "--models", "a")
    fleet.wait_until(
        lambda: devices(models_by_version(fleet).get(("a", 1), {"workers": []})) == ["cpu:1"],
        "model a loaded on cpu:1",
        180,
    )

    x = np.ones((1, 8), dtype=np.float32).tolist()
    with fleet.http(timeout=60) as client:
        ids = [
            client.post("/v1/jobs", json={"model": "a", "inputs": {"x": x}}).json()["id"]
            for _ in range(8)
        ]
        stranded = client.post("/v1/jobs", json={"model": "b", "inputs": {"x": x}}).json()["id"]
        done = wait_all(client, ids)
        assert {job["status"] for job in done} == {"succeeded"}
        assert {job["worker"].split("/")[2] for job in done} == {"cpu:1"}
        assert client.get(f"/v1/jobs/{stranded}").json()["status"] == "queued"

    listed = models_by_version(fleet)
    assert (listed["b", 1]["workers"], listed["b", 1]["served"]) == ([], False)
    assert listed["b", 1]["queued"] == 1

    shutil.copytree(tmp_path / "elsewhere" / "a" / "1", models / "a" / "2")
    reload = tffleet(fleet, "models", "reload")
    assert reload.returncode == 0, reload.stderr
    # Every child listens (cpu:0 too, which serves no model); Redis channels are server-wide,
    # so children of other fleets on this server may hear it as well.
    heard = re.search(r"(\d+) worker children are rescanning", reload.stdout)
    assert heard and int(heard.group(1)) >= 2, reload.stdout
    fleet.wait_until(
        lambda: devices(models_by_version(fleet).get(("a", 2), {"workers": []})) == ["cpu:1"],
        "a:2 loaded on cpu:1 after the reload",
        60,
    )
    assert models_by_version(fleet)["a", 1]["retired"] is True


def test_a_model_added_while_the_worker_runs_is_served_after_a_reload(
    fleet_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    build_mlp(models, name="a", seed=1)
    new = build_mlp(tmp_path / "later", name="mnv2", seed=4)
    # A long poll: only `tffleet models reload` makes the worker notice the new model soon.
    fleet = fleet_factory(
        sqlite_url, models, devices="cpu:1", extra_env={"TFFLEET_MODEL_POLL_S": "60"}
    )
    fleet.start_api(wait=False)  # ready while the worker loads TensorFlow
    fleet.start_worker()

    shutil.copytree(tmp_path / "later" / "mnv2", models / "mnv2")
    reload = tffleet(fleet, "models", "reload")
    assert reload.returncode == 0, reload.stderr
    fleet.wait_until(
        lambda: devices(models_by_version(fleet).get(("mnv2", 1), {"workers": []})) == ["cpu:0"],
        "mnv2:1 loaded after the reload",
        60,
    )
    assert "serving new model mnv2:1" in fleet.log("worker")

    # Its queue, unknown at the worker's start, is consumed now: the job runs.
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    with fleet.http(timeout=60) as client:
        submitted = client.post("/v1/jobs", json={"model": "mnv2", "inputs": {"x": x.tolist()}})
        assert submitted.status_code == 202, submitted.text
        job = client.get(f"/v1/jobs/{submitted.json()['id']}", params={"wait": 30}).json()
    assert job["status"] == "succeeded", job
    np.testing.assert_allclose(job["outputs"]["output_0"], new(x), rtol=1e-5, atol=1e-6)
