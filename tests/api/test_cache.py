"""The response cache through the API: a model with `cache = true` in its config answers a
repeated input at once, `succeeded` and `cached` in the 202, with no wake-up published; per
tenant unless `cache_shared = true`; lookups counted in tffleet_cache_lookups_total."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY
from sqlalchemy.orm import Session, sessionmaker

from db import registry
from tests.api.conftest import SIGNATURES, OpenApi, Publication, finish_job, read_job

pytestmark = [pytest.mark.anyio, pytest.mark.both_databases]

Sessions = sessionmaker[Session]

ROW = [1.0, 2.0, 3.0, 4.0]
Y = np.array([[0.5, -1.5]], dtype=np.float32)


def configure(sessions: Sessions, version: int, **config: Any) -> None:
    """Register mlp:`version` with this model.toml config, as a worker that loaded it would."""
    inputs, outputs = SIGNATURES["mlp"][version]
    with sessions.begin() as session:
        registry.register(
            session=session,
            name="mlp",
            version=version,
            format="savedmodel",
            inputs=inputs,
            outputs=outputs,
            config=config,
        )


def lookups(result: str) -> float:
    labels = {"model": "mlp", "result": result}
    return REGISTRY.get_sample_value("tffleet_cache_lookups_total", labels) or 0.0


def job(version: int = 1, row: list[float] = ROW) -> dict[str, Any]:
    return {"model": "mlp", "version": version, "inputs": {"x": [row]}}


async def test_a_repeated_input_ends_at_once_with_the_outputs_and_no_wake_up(
    open_api: OpenApi, sessions: Sessions, publications: list[Publication]
) -> None:
    configure(sessions, 1, cache=True)
    hits, misses = lookups("hit"), lookups("miss")
    async with open_api() as api:
        first = (await api.client.post("/v1/jobs", json=job())).json()
        assert (first["status"], first["cached"]) == ("queued", False)
        finish_job(sessions, first["id"], {"y": Y})

        response = await api.client.post("/v1/jobs", json=job())
        polled = (await api.client.get(f"/v1/jobs/{response.json()['id']}")).json()

    assert response.status_code == 202
    again = response.json()
    assert (again["status"], again["cached"], again["attempts"]) == ("succeeded", True, 0)
    assert again["outputs"] == {"y": Y.tolist()}
    assert again["worker"] is None
    assert again["started_at"] == again["finished_at"] is not None
    assert polled == again
    assert [p.job_ids for p in publications] == [[first["id"]]]  # the hit woke no worker
    assert read_job(sessions, again["id"]).inputs is None  # nothing left to run
    assert (lookups("hit") - hits, lookups("miss") - misses) == (1, 1)


async def test_the_cache_is_per_tenant_unless_the_model_shares_it(
    open_api: OpenApi, sessions: Sessions
) -> None:
    configure(sessions, 1, cache=True)
    configure(sessions, 2, cache=True, cache_shared=True)
    async with open_api() as api:
        alice, bob = api.key("alice"), api.key("bob")
        for version in (1, 2):
            ran = (await api.client.post("/v1/jobs", json=job(version), headers=alice)).json()
            finish_job(sessions, ran["id"], {"y": np.zeros((1, 1 + version), np.float32)})

        own = (await api.client.post("/v1/jobs", json=job(1), headers=alice)).json()
        other = (await api.client.post("/v1/jobs", json=job(1), headers=bob)).json()
        shared = (await api.client.post("/v1/jobs", json=job(2), headers=bob)).json()

    assert (own["status"], own["cached"]) == ("succeeded", True)
    assert (other["status"], other["cached"]) == ("queued", False)
    assert (shared["status"], shared["cached"]) == ("succeeded", True)
    assert shared["outputs"] == {"y": [[0.0, 0.0, 0.0]]}


async def test_a_model_without_the_cache_runs_every_job(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api() as api:  # the fake fleet's models: no config
        first = (await api.client.post("/v1/jobs", json=job())).json()
        finish_job(sessions, first["id"], {"y": Y})
        again = (await api.client.post("/v1/jobs", json=job())).json()

    assert (again["status"], again["cached"]) == ("queued", False)
    assert read_job(sessions, again["id"]).cache_key is None


async def test_a_batch_answers_its_hits_and_wakes_workers_for_the_rest(
    open_api: OpenApi, sessions: Sessions, publications: list[Publication]
) -> None:
    configure(sessions, 1, cache=True)
    async with open_api() as api:
        first = (await api.client.post("/v1/jobs", json=job())).json()
        finish_job(sessions, first["id"], {"y": Y})
        del publications[:]

        response = await api.client.post(
            "/v1/jobs", json={"jobs": [job(), job(row=[9.0, 9.0, 9.0, 9.0]), job()]}
        )

    out = response.json()["jobs"]
    assert [(j["status"], j["cached"]) for j in out] == [
        ("succeeded", True),
        ("queued", False),
        ("succeeded", True),
    ]
    assert out[0]["outputs"] == out[2]["outputs"] == {"y": Y.tolist()}
    assert [p.job_ids for p in publications] == [[out[1]["id"]]]


async def test_a_hit_is_answered_as_an_npz_when_asked(
    open_api: OpenApi, sessions: Sessions
) -> None:
    configure(sessions, 1, cache=True)
    async with open_api() as api:
        first = (await api.client.post("/v1/jobs", json=job())).json()
        finish_job(sessions, first["id"], {"y": Y})
        response = await api.client.post(
            "/v1/jobs", json=job(), headers={"Accept": "application/x-npz"}
        )

    assert response.status_code == 202
    assert response.headers["content-type"] == "application/x-npz"
    stored = json.loads(response.headers["Tffleet-Job"])
    assert (stored["status"], stored["cached"]) == ("succeeded", True)
    np.testing.assert_array_equal(np.load(io.BytesIO(response.content))["y"], Y)


async def test_an_idempotent_retry_replays_the_cached_job(
    open_api: OpenApi, sessions: Sessions
) -> None:
    configure(sessions, 1, cache=True)
    async with open_api() as api:
        first = (await api.client.post("/v1/jobs", json=job())).json()
        finish_job(sessions, first["id"], {"y": Y})
        headers = {"Idempotency-Key": "k1"}
        keyed = await api.client.post("/v1/jobs", json=job(), headers=headers)
        replayed = await api.client.post("/v1/jobs", json=job(), headers=headers)

    assert keyed.headers["Idempotent-Replayed"] == "false"
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert (keyed.json()["cached"], keyed.json()["status"]) == (True, "succeeded")
    assert replayed.json()["id"] == keyed.json()["id"]
    assert replayed.json()["cached"] is True
