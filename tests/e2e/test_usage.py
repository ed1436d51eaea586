"""What jobs cost, end to end (DESIGN §15): real API and worker processes (two CPU children), a
real model. The jobs' `device_s` add up to the devices' busy seconds
(`tffleet_device_busy_seconds_total`) within 5%, and so do `GET /v1/usage`'s sums and the
counter `tffleet_device_seconds_total{tenant,model}`; a split job counts once, its parts summed.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from db import tenants
from db.engine import make_engine, make_sessionmaker
from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp

pytestmark = pytest.mark.slow

TOLERANCE = 0.05


async def _run(
    fleet: Fleet, bodies: list[dict[str, Any]], headers: dict[str, str]
) -> list[dict[str, Any]]:
    limit = asyncio.Semaphore(16)
    async with fleet.ahttp(timeout=60) as client:
        client.headers.update(headers)

        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with limit:
                r = await client.post("/v1/jobs", json=body)
                assert r.status_code == 202, r.text
                job_id = r.json()["id"]
                for _ in range(10):
                    r = await client.get(f"/v1/jobs/{job_id}", params={"wait": 30})
                    if r.json()["status"] in ("succeeded", "failed", "canceled"):
                        return dict(r.json())
                raise AssertionError(f"job {job_id} did not finish")

        return list(await asyncio.gather(*(one(body) for body in bodies)))


def _metric(text: str, name: str, **labels: str) -> float:
    """A metric's samples with these labels (and any others), summed."""
    total = 0.0
    for match in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_the_jobs_device_seconds_add_up_to_the_devices_busy_seconds(
    fleet_factory, sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    build_mlp(models)
    # Batches of at most 16 samples: the 64-sample job is split across both children.
    (models / "mlp" / "model.toml").write_text("max_batch_size = 16\nbuckets = [4, 16]\n")
    fleet = fleet_factory(sqlite_url, models, devices="cpu:2")
    fleet.start_api()
    fleet.start_worker()
    rng = np.random.default_rng(0)
    sizes = [int(rng.integers(1, 9)) for _ in range(150)] + [64]
    bodies = [
        {"model": "mlp", "inputs": {"x": rng.normal(size=(n, 8)).astype(np.float32).tolist()}}
        for n in sizes
    ]
    acme, zeta = _key(fleet, "acme"), _key(fleet, "zeta")

    # The 64-sample job goes alone, last: a job is split only while nothing else of its model
    # is queued (worker/feeder.py), so among the others it might run whole.
    done = (
        asyncio.run(_run(fleet, bodies[:-1:2], acme))
        + asyncio.run(_run(fleet, bodies[-1:], acme))
        + asyncio.run(_run(fleet, bodies[1::2], zeta))
    )

    assert {job["status"] for job in done} == {"succeeded"}
    metrics = _scrape_settled(fleet)
    busy = _metric(metrics, "tffleet_device_busy_seconds_total", model="mlp")
    assert busy > 0, metrics[-3000:]
    device_s = sum(job["usage"]["device_s"] for job in done)
    assert device_s == pytest.approx(busy, rel=TOLERANCE), (device_s, busy)
    assert sum(job["usage"]["samples"] for job in done) == sum(sizes)
    split = next(job for job in done if job["usage"]["samples"] == 64)
    assert split["progress"] is not None and split["usage"]["device_s"] > 0
    counted = _metric(metrics, "tffleet_device_seconds_total", model="mlp")
    assert counted == pytest.approx(busy, rel=TOLERANCE), (counted, busy)

    with fleet.http(timeout=30) as client:
        summed = client.get("/v1/usage", params={"group_by": "tenant"}).json()
    assert summed["total"]["samples"] == sum(sizes)
    assert summed["total"]["device_s"] == pytest.approx(busy, rel=TOLERANCE)
    groups = {g["tenant"]: g for g in summed["groups"]}
    half = len(bodies[::2])  # acme ran the even bodies (the split job among them), zeta the odd
    for name, mine in (("acme", done[:half]), ("zeta", done[half:])):
        assert groups[name]["jobs"] == len(mine)
        assert groups[name]["device_s"] == pytest.approx(
            sum(job["usage"]["device_s"] for job in mine), rel=1e-3
        )
        assert _metric(metrics, "tffleet_device_seconds_total", tenant=name) == pytest.approx(
            groups[name]["device_s"], rel=1e-3
        )


def _scrape_settled(fleet: Fleet, timeout_s: float = 10.0) -> str:
    """The worker's metrics once the last batch's counters are in (a job's end is committed, and
    may be read, just before its writer counts it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(f"http://127.0.0.1:{fleet.metrics_port}/metrics").text
        busy = _metric(text, "tffleet_device_busy_seconds_total", model="mlp")
        counted = _metric(text, "tffleet_device_seconds_total", model="mlp")
        if counted >= busy * (1 - TOLERANCE / 10) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def _key(fleet: Fleet, tenant: str) -> dict[str, str]:
    engine = make_engine(fleet.database_url)
    with make_sessionmaker(engine).begin() as session:
        made = tenants.create_key(session=session, tenant=tenant)
    engine.dispose()
    return {"Authorization": f"Bearer {made.key}"}
