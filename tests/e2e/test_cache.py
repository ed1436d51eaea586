"""The response cache with real processes: a repeated input ends at once, per tenant.

A model with `cache = true` in its model.toml: the first job of an input runs on the worker;
the same input again, from the same tenant, is answered by the API from the stored outputs,
`succeeded` and `cached` in the 202 itself, never queued and never run. Another tenant's equal
input runs (the cache is per tenant), unless the model says `cache_shared = true`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import SharedFleet

pytestmark = pytest.mark.slow


def test_a_repeated_input_is_answered_from_the_cache_and_only_for_its_tenant(
    shared_fleet: SharedFleet,
) -> None:
    # `cached` says `cache = true` in its model.toml, `cached_shared` `cache_shared = true` too.
    fleet = shared_fleet.fleet
    alice, bob = shared_fleet.key("alice"), shared_fleet.key("bob")
    job = {"model": "cached", "inputs": {"x": np.arange(8, dtype=np.float32)[None].tolist()}}

    with fleet.http(timeout=60) as client:
        first = client.post("/v1/jobs", params={"wait": 30}, json=job, headers=alice).json()
        again = client.post("/v1/jobs", json=job, headers=alice)
        other = client.post("/v1/jobs", params={"wait": 30}, json=job, headers=bob).json()
        shared_job = {**job, "model": "cached_shared"}
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
    assert 'tffleet_cache_lookups_total{model="cached",result="hit"} 1.0' in metrics
    assert 'tffleet_cache_lookups_total{model="cached",result="miss"} 2.0' in metrics
