"""What jobs cost, over HTTP (DESIGN §15): an ended job's `usage` in its JSON, `GET /v1/usage`
summing `usage_records` per tenant, model or day (an admin sees all, a tenant its own), and the
console's tenants with their last hour's device seconds. On the real app, SQLite and
PostgreSQL; the worker is played through `db.jobs` and `db.usage`.

The worker's side (the split of each pass, the records it writes): tests/worker/test_usage.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, usage
from db.models import UsageRecord
from tests.api.conftest import Api
from tffleet import tensors

pytestmark = [pytest.mark.anyio, pytest.mark.both_databases]

Sessions = sessionmaker[Session]

NOW = datetime(2025, 3, 10, 14, 30, tzinfo=UTC)  # far from the clock: no record of now


@pytest.fixture(autouse=True)
def no_records(sessions: Sessions) -> Iterator[None]:
    """usage_records of this test alone (the suite's truncation does not empty them)."""
    with sessions.begin() as session:
        session.execute(delete(UsageRecord))
    yield
    with sessions.begin() as session:
        session.execute(delete(UsageRecord))


def spent(
    sessions: Sessions,
    at: datetime,
    tenant: str,
    model: str,
    *,
    jobs_n: int = 1,
    samples: int = 1,
    device_s: float = 1.0,
) -> None:
    """A batch's record, as a worker writes it."""
    batch = usage.Batch(model)
    for _ in range(jobs_n):
        batch.add(tenant, ended=True, samples=samples, device_s=device_s, queue_s=0.5, run_s=2.0)
    with sessions.begin() as session:
        usage.record(session, batch, at=at)


def seed(sessions: Sessions) -> None:
    """Two tenants, two models, two days."""
    spent(sessions, NOW, "acme", "mlp", jobs_n=2, samples=3, device_s=0.25)
    spent(sessions, NOW - timedelta(minutes=40), "acme", "cnn", device_s=2.0)
    spent(sessions, NOW - timedelta(hours=20), "zeta", "mlp", samples=5, device_s=0.5)
    spent(sessions, NOW - timedelta(days=3), "zeta", "mlp", device_s=100.0)  # out of range


async def read(api: Api, headers: dict[str, str] | None = None, **params: str) -> dict[str, Any]:
    params.setdefault("to", "2025-03-10T15:00:00Z")
    response = await api.client.get("/v1/usage", params=params, headers=headers or {})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_an_admin_sees_every_tenants_usage_per_tenant_model_or_day(
    api: Api, sessions: Sessions
) -> None:
    seed(sessions)

    by_tenant = await read(api)
    assert (by_tenant["from"], by_tenant["to"]) == ("2025-03-09T15:00:00Z", "2025-03-10T15:00:00Z")
    assert by_tenant["tenant"] is None
    assert by_tenant["groups"] == [
        {"tenant": "acme", "jobs": 3, "samples": 7, "device_s": 2.5, "queue_s": 1.5, "run_s": 6.0},
        {"tenant": "zeta", "jobs": 1, "samples": 5, "device_s": 0.5, "queue_s": 0.5, "run_s": 2.0},
    ]
    assert by_tenant["total"] == {
        "jobs": 4, "samples": 12, "device_s": 3.0, "queue_s": 2.0, "run_s": 8.0
    }  # fmt: skip

    by_model = await read(api, group_by="model")
    assert {g["model"]: g["device_s"] for g in by_model["groups"]} == {"cnn": 2.0, "mlp": 1.0}

    by_day = await read(api, group_by="day", **{"from": "2025-03-01T00:00:00Z"})
    assert {g["day"]: g["device_s"] for g in by_day["groups"]} == {
        "2025-03-07": 100.0,
        "2025-03-09": 0.5,
        "2025-03-10": 2.5,
    }


async def test_a_tenant_sees_its_own_usage_only(api: Api, sessions: Sessions) -> None:
    seed(sessions)
    acme = api.key("acme")

    mine = await read(api, headers=acme, group_by="model")
    assert mine["tenant"] == "acme"
    assert {g["model"]: g["jobs"] for g in mine["groups"]} == {"cnn": 1, "mlp": 2}
    assert [g["tenant"] for g in (await read(api, headers=acme))["groups"]] == ["acme"]


async def test_from_and_to_are_taken_to_the_hour_and_default_to_the_last_24_hours(
    api: Api, sessions: Sessions
) -> None:
    with sessions() as session:
        now = clock.now(session)
    spent(sessions, now, "acme", "mlp", device_s=1.0)
    spent(sessions, now - timedelta(hours=30), "acme", "mlp", device_s=7.0)

    response = await api.client.get("/v1/usage")
    assert response.status_code == 200, response.text
    assert response.json()["total"]["device_s"] == 1.0

    # 14:30 to 14:31 covers the hour from 14:00 to 15:00: both of NOW's hour's records.
    spent(sessions, NOW - timedelta(minutes=20), "acme", "mlp", device_s=3.0)
    narrow = await read(api, **{"from": "2025-03-10T14:30:00", "to": "2025-03-10T14:31:00+00:00"})
    assert (narrow["from"], narrow["to"]) == ("2025-03-10T14:00:00Z", "2025-03-10T15:00:00Z")
    assert narrow["total"]["device_s"] == 3.0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"group_by": "week"}, "group_by"),
        ({"from": "2026-11-27T10:00:00Z", "to": "2026-11-27T09:00:00Z"}, "to"),
        ({"from": "2020-01-01T00:00:00Z", "to": "2026-11-27T09:00:00Z"}, "from"),
        # Times whose default span or rounding to the hour would leave the calendar (found by
        # tests/api/test_fuzz.py: a 500).
        ({"group_by": "day", "to": "0001-01-01T01:00:01Z"}, "to"),
        ({"from": "9999-12-31T23:30:00Z"}, "from"),
        ({"to": "0001-01-01T00:00:00+01:00"}, "to"),
    ],
)
async def test_bad_input_is_a_422_naming_the_field(
    api: Api, params: dict[str, str], field: str
) -> None:
    response = await api.client.get("/v1/usage", params=params)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert field in error["message"], error


async def test_usage_takes_a_key(api: Api) -> None:
    response = await api.client.get("/v1/usage", headers={"Authorization": ""})
    assert response.status_code == 401


async def test_an_ended_job_shows_its_usage_and_an_unended_one_none(
    api: Api, sessions: Sessions
) -> None:
    created = await api.client.post("/v1/jobs", json={"model": "mlp", "inputs": [[1, 2, 3, 4]]})
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    assert created.json()["usage"] is None
    canceled = await api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": [[1, 2, 3, 4], [5, 6, 7, 8]]}
    )
    never_ran = canceled.json()["id"]
    assert (await api.client.post(f"/v1/jobs/{never_ran}/cancel")).status_code == 200

    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
    outputs = tensors.pack({"y": np.zeros((1, 2), dtype=np.float32)})
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, outputs)], device_s={job_id: 0.125})

    job = (await api.client.get(f"/v1/jobs/{job_id}")).json()
    assert job["usage"]["device_s"] == 0.125 and job["usage"]["samples"] == 1
    started = datetime.fromisoformat(job["started_at"])
    assert job["usage"]["queue_s"] == pytest.approx(
        (started - datetime.fromisoformat(job["created_at"])).total_seconds(), abs=1e-5
    )
    assert job["usage"]["run_s"] == pytest.approx(
        (datetime.fromisoformat(job["finished_at"]) - started).total_seconds(), abs=1e-5
    )
    other = (await api.client.get(f"/v1/jobs/{never_ran}")).json()
    assert other["usage"]["device_s"] == 0 and other["usage"]["run_s"] == 0
    assert other["usage"]["samples"] == 2 and other["usage"]["queue_s"] >= 0


async def test_the_console_shows_each_tenants_device_seconds_over_the_last_hour(
    api: Api, sessions: Sessions
) -> None:
    with sessions() as session:
        now = clock.now(session)
    spent(sessions, now, "acme", "mlp", device_s=4.0)
    spent(sessions, now - timedelta(hours=3), "acme", "mlp", device_s=50.0)

    overview = (await api.client.get("/v1/console/overview")).json()

    acme = next(t for t in overview["tenants"] if t["name"] == "acme")
    assert acme["device_s_1h"] == 4.0
    default = next(t for t in overview["tenants"] if t["name"] == "default")
    assert default["device_s_1h"] == 0.0
