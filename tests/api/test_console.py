"""The console's reads: the overview (models and their holders, devices, tenants, the last
minutes, the latest failures) and one job with its timeline and output shapes, for admin keys
only. On the real app, database and Redis, with the worker played through `db.jobs`.

The page itself, in a real browser: tests/browser/test_console.py.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, tenants
from db.models import Job, JobErrorCode, PresenceState
from tests.api.conftest import Api, finish_job
from tests.api.test_models import report

pytestmark = [pytest.mark.anyio, pytest.mark.both_databases]

Sessions = sessionmaker[Session]


async def submit(api: Api, *, model: str = "mlp", headers: dict[str, str] | None = None) -> str:
    response = await api.client.post(
        "/v1/jobs", json={"model": model, "inputs": [[1, 2, 3, 4]]}, headers=headers or {}
    )
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


async def test_the_console_reads_take_an_admin_key(api: Api) -> None:
    tenant = api.key("acme")
    for path in ("/v1/console/overview", "/v1/console/jobs/x"):
        anonymous = await api.client.get(path, headers={"Authorization": ""})
        assert anonymous.status_code == 401, path
        refused = await api.client.get(path, headers=tenant)
        assert refused.status_code == 403, path
        assert "admin key" in refused.json()["error"]["message"]


async def test_the_page_loads_without_a_key_and_its_files_come_from_the_package(
    api: Api,
) -> None:
    page = await api.client.get("/console", headers={"Authorization": ""})
    script = await api.client.get("/console/assets/console.js", headers={"Authorization": ""})

    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "console/assets/console.js" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere
    # The key prompt points at the key `tffleet up` printed before saying how to make one.
    assert page.text.index(".tffleet/admin.key") < page.text.index("tffleet keys create")
    assert script.status_code == 200 and "v1/console/overview" in script.text
    assert "https://" not in script.text


async def test_the_overview_shows_models_holders_devices_tenants_minutes_and_failures(
    api: Api, sessions: Sessions
) -> None:
    with sessions.begin() as session:
        tenants.set_limits(session=session, name="acme", max_queued_jobs=50, weight=3)
    acme = api.key("acme")
    report(sessions, "cpu:0", ("mlp", 2, PresenceState.LOADED))
    queued = [await submit(api, headers=acme) for _ in range(2)]
    done = await submit(api)
    finish_job(sessions, done, {"y": np.zeros((1, 3), np.float32)})
    failed = await submit(api)
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=[failed], owner="w", lease_s=60)
    with sessions.begin() as session:
        jobs.fail(session=session, leases=leases, code=JobErrorCode.MODEL_ERROR, message="boom")

    response = await api.client.get("/v1/console/overview")

    assert response.status_code == 200, response.text
    o = response.json()
    mlp2 = next(m for m in o["models"] if (m["name"], m["version"]) == ("mlp", 2))
    assert mlp2["served"] and mlp2["latest"] and mlp2["queued"] == 2 and mlp2["running"] == 0
    assert mlp2["oldest_queued_s"] is not None and mlp2["oldest_queued_s"] >= 0
    (holder,) = mlp2["holders"]
    assert (holder["host"], holder["device"], holder["state"]) == ("host", "cpu:0", "loaded")
    (device,) = o["devices"]
    assert device["device"] == "cpu:0" and device["models"] == ["mlp:2 loaded"]
    acme_row = next(t for t in o["tenants"] if t["name"] == "acme")
    assert acme_row == {
        "name": "acme", "weight": 3, "max_queued_jobs": 50, "queued": 2, "running": 0,
        "device_s_1h": 0.0,
    }  # fmt: skip
    assert len(o["minutes"]) == 16
    # Ended this minute, or the last one if a minute began since.
    recent = o["minutes"][-2:]
    assert sum(m["ended"] for m in recent) == 2 and sum(m["failed"] for m in recent) == 1
    assert any(m["p50_ms"] is not None for m in recent)
    assert [f["id"] for f in o["failures"]] == [failed]
    assert o["failures"][0]["code"] == "model_error" and o["failures"][0]["message"] == "boom"
    assert set(queued).isdisjoint(f["id"] for f in o["failures"])
    assert o["stalled"] == []  # queued a moment ago: not past TFFLEET_STALL_WARN_S


async def test_the_overview_warns_of_a_model_whose_ready_children_claim_nothing(
    api: Api, sessions: Sessions
) -> None:
    report(sessions, "cpu:0", ("mlp", 2, PresenceState.LOADED))  # never claimed
    waiting = await submit(api)
    with sessions.begin() as session:
        at = clock.now(session) - timedelta(seconds=120)
        session.execute(update(Job).where(Job.id == waiting).values(created_at=at))

    o = (await api.client.get("/v1/console/overview")).json()

    assert o["stall_warn_s"] == 60
    (stalled,) = o["stalled"]
    assert {k: v for k, v in stalled.items() if k != "stalled_s"} == {
        "model": "mlp", "queued": 1, "ready_children": 1,
    }  # fmt: skip
    assert 120 <= stalled["stalled_s"] < 140


async def test_a_job_shows_its_timeline_and_its_outputs_shapes(
    api: Api, sessions: Sessions
) -> None:
    job_id = await submit(api, headers=api.key("acme"))
    with sessions.begin() as session:
        leases = jobs.claim(
            session=session, job_ids=[job_id], owner="w1", lease_s=60, worker="host-a/7/cpu:0"
        )
    with sessions.begin() as session:
        jobs.release(session=session, leases=leases)
    finish_job(sessions, job_id, {"y": np.zeros((1, 3), np.float32), "s": np.array([b"x"])})

    response = await api.client.get(f"/v1/console/jobs/{job_id}")

    assert response.status_code == 200, response.text
    job = response.json()
    assert job["tenant"] == "acme" and job["status"] == "succeeded" and job["outputs"] is None
    assert [(e["event"], e.get("detail")) for e in job["timeline"]] == [
        ("created", None),
        ("started", "host-a/7/cpu:0"),
        ("requeued", "handed back by its worker"),
        ("started", "test-worker"),
        ("succeeded", None),
    ]
    assert job["output_shapes"] == {
        "s": {"dtype": "string", "shape": [1]},
        "y": {"dtype": "float32", "shape": [1, 3]},
    }
    missing = await api.client.get("/v1/console/jobs/nope")
    assert missing.status_code == 404
    queued = await api.client.get(f"/v1/console/jobs/{await submit(api)}")
    assert queued.json()["queue_position"] == 0 and queued.json()["output_shapes"] is None
