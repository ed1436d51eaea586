"""/healthz, /readyz, /metrics and /v1/models."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import redis

from tests.api.conftest import DEAD_BROKER_URL, SIGNATURES, OpenApi, broker_lists

pytestmark = pytest.mark.anyio


async def test_healthz_is_200(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_is_200_when_database_and_broker_answer(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}


async def test_readyz_is_503_when_the_broker_is_unreachable(open_api: OpenApi) -> None:
    async with open_api(broker_url=DEAD_BROKER_URL) as api:
        response = await api.client.get("/readyz")
        alive = await api.client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["database"] == "ok"
    assert body["broker"].startswith("unreachable")
    assert alive.status_code == 200  # up, only not ready


def submitted_total(metrics: str, model: str) -> float:
    match = re.search(
        rf'^tffleet_jobs_submitted_total\{{model="{model}"\}} (\S+)$', metrics, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


async def test_metrics_count_submitted_jobs(client: httpx.AsyncClient) -> None:
    before = submitted_total((await client.get("/metrics")).text, "count")
    await client.post("/v1/jobs", json={"model": "count", "inputs": [[1, 2, 3]]})
    await client.post("/v1/jobs", json={"model": "count", "inputs": [[1, 2, 3]]})

    response = await client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "# TYPE tffleet_jobs_submitted_total counter" in response.text
    assert submitted_total(response.text, "count") == before + 2


async def test_models_lists_every_registered_signature(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")

    assert response.status_code == 200
    listed = {(m["name"], m["version"]): m for m in response.json()["models"]}
    expected: dict[tuple[str, int], Any] = {
        (name, version): signature
        for name, versions in SIGNATURES.items()
        for version, signature in versions.items()
    }
    assert set(listed) == set(expected)
    for key, (inputs, outputs) in expected.items():
        assert listed[key]["inputs"] == inputs
        assert listed[key]["outputs"] == outputs


DEAD_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # nothing listens on port 1


async def test_with_the_database_unreachable_readyz_and_submit_are_503(
    open_api: OpenApi, broker: redis.Redis
) -> None:
    async with open_api(database_url=DEAD_DATABASE_URL) as api:
        ready = await api.client.get("/readyz")
        submit = await api.client.post("/v1/jobs", json={"model": "mlp", "inputs": [[1, 2, 3, 4]]})
        poll = await api.client.get("/v1/jobs/01890000-0000-7000-8000-000000000000")

    assert ready.status_code == 503
    assert ready.json()["database"].startswith("unreachable")
    assert ready.json()["broker"] == "ok"
    assert submit.status_code == 503
    assert submit.json()["error"]["code"] == "unavailable"
    assert poll.status_code == 503
    assert broker_lists(broker) == []
