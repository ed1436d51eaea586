"""The response cache with real processes: a repeated input ends at once, per tenant.

A model with `cache = true` in its model.toml: the first job of an input runs on the worker;
the same input again, from the same tenant, is answered by the API from the stored outputs,
`succeeded` and `cached` in the 202 itself, never queued and never run. Another tenant's equal
input runs (the cache is per tenant), unless the model says `cache_shared = true`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from db.migrate import upgrade
from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp
from tests.e2e.test_fair_share import key

pytestmark = pytest.mark.slow


def test_a_repeated_input_is_answered_from_the_cache_and_only_for_its_tenant(
    fleet_factory, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'cache.db'}"
    upgrade(database_url)
    build_mlp(tmp_path / "models")
    (tmp_path / "models" / "mlp" / "model.toml").write_text("cache = true\n")
    build_mlp(tmp_path / "models", name="shared")
    (tmp_path / "models" / "shared" / "model.toml").write_text(
        "cache = true\ncache_shared = true\n"
    )
    fleet: Fleet = fleet_factory(database_url, tmp_path / "models", devices="cpu:1")
    fleet.start_api()
    fleet.start_worker()
    alice, bob = key(fleet, "alice"), key(fleet, "bob")
    job = {"model": "mlp", "inputs": {"x": np.arange(8, dtype=np.float32)[None].tolist()}}

    with fleet.http(timeout=60) as client:
        first = client.post("/v1/jobs", params={"wait": 30}, json=job, headers=alice).json()
        again = client.post("/v1/jobs", json=job, headers=alice)
        other = client.post("/v1/jobs", params={"wait": 30}, json=job, headers=bob).json()
        shared_job = {**job, "model": "shared"}
        ran = client.post("/v1/jobs", params={"wait": 30}, json=shared_job, headers=alice).json()
        shared = client.post("/v1/jobs", json=shared_job, headers=bob).json()
        metrics = client.get("/metrics").text

    assert (first["status"], first["cached"], first["attempts"]) == ("succeeded", False, 1)
    assert again.status_code == 202
    hit = again.json()
    assert (hit["status"], hit["cached"], hit["attempts"]) == ("succeeded", True, 0)
    assert hit["started_at"] == hit["finished_at"] and hit["worker"] is None  # never ran
    assert hit["outputs"] == first["outputs"]
    assert (other["status"], other["cached"], other["attempts"]) == ("succeeded", False, 1)
    assert (ran["status"], ran["cached"]) == ("succeeded", False)
    assert (shared["status"], shared["cached"], shared["attempts"]) == ("succeeded", True, 0)
    assert shared["outputs"] == ran["outputs"]
    assert 'tffleet_cache_lookups_total{model="mlp",result="hit"} 1.0' in metrics
    assert 'tffleet_cache_lookups_total{model="mlp",result="miss"} 2.0' in metrics
