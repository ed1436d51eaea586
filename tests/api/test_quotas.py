"""A tenant's quotas: queued jobs (429 `quota_exceeded`), samples per job and priority (422),
retention (cut to its longest). Its own limits (`tffleet tenants set`) over the fleet's defaults."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from api import admission
from db import tenants
from tests.api.conftest import Api, OpenApi, count_jobs, read_job

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]


def body(samples: int = 1, **extra: object) -> dict[str, object]:
    return {"model": "mlp", "inputs": np.ones((samples, 4)).tolist(), **extra}


def set_limits(api: Api, tenant: str, **values: int | None) -> None:
    with api.sessions.begin() as session:
        tenants.set_limits(session=session, name=tenant, **values)


async def test_a_tenant_past_its_queued_quota_is_429_while_others_go_on(
    open_api: OpenApi, sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "COUNT_TTL_S", 0.0)
    async with open_api(tenant_max_queued_jobs=2) as api:
        acme, globex = api.key("acme"), api.key("globex")
        codes = [
            (await api.client.post("/v1/jobs", json=body(), headers=acme)).status_code
            for _ in range(2)
        ]
        refused = await api.client.post("/v1/jobs", json=body(), headers=acme)
        other = await api.client.post("/v1/jobs", json=body(), headers=globex)

    assert codes == [202, 202]
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert "'acme'" in error["message"] and "quota of 2" in error["message"]
    assert other.status_code == 202
    assert count_jobs(sessions) == 3


async def test_a_bulk_submit_that_would_pass_the_quota_stores_none_of_its_jobs(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(tenant_max_queued_jobs=3) as api:
        response = await api.client.post(
            "/v1/jobs", json={"jobs": [body()] * 4}, headers=api.key("acme")
        )

    assert response.status_code == 429
    assert count_jobs(sessions) == 0


async def test_a_tenants_own_limits_win_over_the_defaults(api: Api, sessions: Sessions) -> None:
    set_limits(api, "acme", max_samples_per_job=2, max_priority=3)
    acme, globex = api.key("acme"), api.key("globex")

    too_big = await api.client.post("/v1/jobs", json=body(3), headers=acme)
    too_urgent = await api.client.post("/v1/jobs", json=body(priority=4), headers=acme)
    fine = await api.client.post("/v1/jobs", json=body(2, priority=3), headers=acme)
    others = await api.client.post("/v1/jobs", json=body(3, priority=9), headers=globex)

    assert too_big.status_code == 422
    assert too_big.json()["error"]["message"].startswith("inputs: 3 samples;")
    assert "at most 2" in too_big.json()["error"]["message"]
    assert too_urgent.status_code == 422
    assert too_urgent.json()["error"]["message"] == "priority: at most 3 for tenant 'acme', got 4"
    assert fine.status_code == 202
    assert others.status_code == 202  # the defaults: 10 and 65,536
    assert count_jobs(sessions) == 2


async def test_the_default_top_priority_keeps_a_tenant_from_jumping_every_queue(api: Api) -> None:
    response = await api.client.post("/v1/jobs", json=body(priority=1000), headers=api.key("acme"))

    assert response.status_code == 422
    assert "priority: at most 10" in response.json()["error"]["message"]


async def test_a_bulk_submit_names_the_job_over_a_limit(api: Api) -> None:
    set_limits(api, "acme", max_samples_per_job=1)

    response = await api.client.post(
        "/v1/jobs", json={"jobs": [body(1), body(2)]}, headers=api.key("acme")
    )

    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("jobs[1]: inputs: 2 samples;")


async def test_a_retention_past_the_tenants_longest_is_cut_to_it(
    api: Api, sessions: Sessions
) -> None:
    set_limits(api, "acme", max_ttl_s=60)

    response = await api.client.post("/v1/jobs", json=body(ttl_s=3600), headers=api.key("acme"))

    assert response.status_code == 202
    assert read_job(sessions, response.json()["id"]).ttl_s == 60


async def test_a_limit_set_back_to_none_is_the_default_again(api: Api) -> None:
    set_limits(api, "acme", max_priority=1)
    set_limits(api, "acme", max_priority=None)
    with api.sessions() as session:
        found = tenants.limits(session=session, name="acme", defaults=api.state.admission.defaults)

    assert found.max_priority == 10
