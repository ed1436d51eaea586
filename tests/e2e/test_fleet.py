"""End to end: real API and worker processes, a real PostgreSQL and Redis, real TensorFlow."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.models import build_free_matmul, build_mlp

pytestmark = pytest.mark.slow


async def _submit_and_wait(fleet: Fleet, batches: list[np.ndarray], concurrency: int) -> list[dict]:
    limit = asyncio.Semaphore(concurrency)
    async with fleet.ahttp(timeout=60) as client:

        async def one(x: np.ndarray) -> dict:
            async with limit:
                r = await client.post(
                    "/v1/jobs", json={"model": "mlp", "inputs": {"x": x.tolist()}}
                )
                assert r.status_code == 202, r.text
                job_id = r.json()["id"]
                for _ in range(10):
                    r = await client.get(f"/v1/jobs/{job_id}", params={"wait": 30})
                    if r.json()["status"] in ("succeeded", "failed", "canceled"):
                        return dict(r.json())
                raise AssertionError(f"job {job_id} did not finish")

        return list(await asyncio.gather(*(one(x) for x in batches)))


def test_200_jobs_over_http_succeed_with_the_models_own_outputs_on_both_children(
    fleet_factory, postgres_url: str, tmp_path: Path
) -> None:
    clean_database(postgres_url)
    model = build_mlp(tmp_path / "models")
    fleet = fleet_factory(postgres_url, tmp_path / "models", devices="cpu:2")
    fleet.start_api()
    fleet.start_worker()

    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(int(rng.integers(1, 4)), 8)).astype(np.float32) for _ in range(200)]
    done = asyncio.run(_submit_and_wait(fleet, batches, concurrency=32))

    assert [job["status"] for job in done] == ["succeeded"] * 200
    for x, job in zip(batches, done, strict=True):
        (out,) = job["outputs"].values()
        np.testing.assert_allclose(
            np.asarray(out, dtype=np.float32), model(x), rtol=1e-5, atol=1e-6
        )
    devices = {job["worker"].split("/")[2] for job in done}
    assert devices == {"cpu:0", "cpu:1"}, devices
    # host/pid/device/id, then the Celery task that ran its batch: Flower's /task/<id>.
    for job in done:
        assert re.fullmatch(r"[^/ ]+/\d+/cpu:[01]/\w+ task [0-9a-f-]{36}", job["worker"]), job

    # Both children's metrics, merged and served by the worker's main process.
    metrics = httpx.get(f"http://127.0.0.1:{fleet.metrics_port}/metrics").text
    jobs_run = re.search(r'^tffleet_batch_jobs_sum\{model="mlp"\} (\S+)$', metrics, re.M)
    assert jobs_run and float(jobs_run.group(1)) == 200, metrics[-3000:]
    assert re.search(r'^tffleet_queue_wait_seconds_count\{model="mlp"\} 200', metrics, re.M)
    assert 'tffleet_batch_samples_bucket{le="1.0",model="mlp"}' in metrics


def test_each_child_pins_its_own_device_and_the_main_process_never_loads_tensorflow(
    fleet_factory, sqlite_url: str, tmp_path: Path
) -> None:
    build_mlp(tmp_path / "models")
    # GPU indices on a machine without GPUs: each child still pins its own index; TF uses the CPU.
    fleet = fleet_factory(sqlite_url, tmp_path / "models", devices="0,1")
    fleet.start_api()
    fleet.start_worker()

    log = fleet.log("worker")
    pinned = dict(re.findall(r"child (gpu:\d) \(pid \d+, CUDA_VISIBLE_DEVICES=(\S+)\)", log))
    assert pinned == {"gpu:0": "0", "gpu:1": "1"}, log[-3000:]

    main_pid = fleet.procs["worker"].pid
    child_pids = [int(p) for p in re.findall(r"child gpu:\d \(pid (\d+),", log)]
    assert Path(f"/proc/{main_pid}").exists()
    assert "tensorflow" not in Path(f"/proc/{main_pid}/maps").read_text()
    for pid in child_pids:
        assert "tensorflow" in Path(f"/proc/{pid}/maps").read_text()

    x = np.ones((2, 8), dtype=np.float32)
    (job,) = asyncio.run(_submit_and_wait(fleet, [x], concurrency=1))
    assert job["status"] == "succeeded"


def test_a_job_that_makes_tensorflow_raise_fails_with_model_error_and_the_child_keeps_serving(
    fleet_factory, sqlite_url: str, tmp_path: Path
) -> None:
    weights = build_free_matmul(tmp_path / "models")
    fleet = fleet_factory(sqlite_url, tmp_path / "models", devices="cpu:1")
    fleet.start_api()
    fleet.start_worker()

    with fleet.http(timeout=60) as client:
        bad = client.post("/v1/jobs", json={"model": "matmul", "inputs": [[1, 2, 3, 4, 5]]})
        good = client.post("/v1/jobs", json={"model": "matmul", "inputs": [[1, 2, 3, 4]]})
        assert bad.status_code == good.status_code == 202
        bad_job = client.get(f"/v1/jobs/{bad.json()['id']}", params={"wait": 30}).json()
        good_job = client.get(f"/v1/jobs/{good.json()['id']}", params={"wait": 30}).json()

    assert bad_job["status"] == "failed"
    assert bad_job["error"]["code"] == "model_error"
    assert (
        "InvalidArgument" in bad_job["error"]["message"] or "Matrix" in bad_job["error"]["message"]
    )
    assert good_job["status"] == "succeeded"
    np.testing.assert_allclose(good_job["outputs"]["y"], np.array([[1, 2, 3, 4]]) @ weights)


def test_a_saved_model_copied_into_the_repository_is_served_after_a_worker_restart(
    fleet_factory, sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    build_mlp(models)
    fleet = fleet_factory(sqlite_url, models, devices="cpu:1")
    fleet.start_api()
    fleet.start_worker()

    # A model exported elsewhere, then copied in, as a user would.
    elsewhere = tmp_path / "elsewhere"
    new_model = build_mlp(elsewhere, name="newcomer", seed=11)
    (models / "newcomer").mkdir()
    (elsewhere / "newcomer" / "1").rename(models / "newcomer" / "1")
    fleet.stop("worker")
    fleet.start_worker(expect_models=2)

    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    with fleet.http(timeout=60) as client:
        r = client.post("/v1/jobs", json={"model": "newcomer", "inputs": {"x": x.tolist()}})
        assert r.status_code == 202, r.text
        job = client.get(f"/v1/jobs/{r.json()['id']}", params={"wait": 30}).json()
    assert job["status"] == "succeeded"
    np.testing.assert_allclose(job["outputs"]["output_0"], new_model(x), rtol=1e-5, atol=1e-6)
