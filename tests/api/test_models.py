"""GET /v1/models with workers reporting, and which version a submission gets."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import presence, registry
from db.clock import utcnow
from db.models import PresenceState
from tests.api.conftest import ISO_UTC

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]
ROW = [1.0, 2.0, 3.0, 4.0]


def report(
    sessions: Sessions,
    device: str,
    *held: tuple[str, int, PresenceState],
    error: str | None = None,
    silent_s: float = 0,
) -> None:
    """What a worker child on `device` holds, reported `silent_s` seconds ago."""
    at = utcnow() - timedelta(seconds=silent_s)
    with sessions.begin() as session:
        presence.report(
            session=session,
            child=presence.Child(id=f"host/7/{device}/abc", host="host", pid=7, device=device),
            holdings=[
                presence.Holding(name, version, state, f"/models/{name}/{version}", at, error)
                for name, version, state in held
            ],
            now=at,
        )


async def test_models_show_the_workers_that_hold_each_version_and_the_fleets_load_errors(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    report(sessions, "cpu:0", ("mlp", 1, PresenceState.DRAINING), ("mlp", 2, PresenceState.LOADED))
    report(sessions, "cpu:1", ("mlp", 2, PresenceState.LOADING), ("pair", 1, PresenceState.LOADED))
    report(sessions, "cpu:2", ("mlp", 3, PresenceState.FAILED), error="ValueError: corrupt")
    report(sessions, "cpu:3", ("count", 1, PresenceState.LOADED), silent_s=3600)  # died
    with sessions.begin() as session:
        registry.retire(session=session, name="mlp", version=1)
    queued = await client.post("/v1/jobs", json={"model": "mlp", "version": 2, "inputs": [ROW]})
    assert queued.status_code == 202

    response = await client.get("/v1/models")

    assert response.status_code == 200
    body = response.json()
    listed = {(m["name"], m["version"]): m for m in body["models"]}
    old, new, count = listed["mlp", 1], listed["mlp", 2], listed["count", 1]
    assert (old["retired"], old["served"], old["latest"]) == (True, False, False)
    assert ISO_UTC.match(old["retired_at"])
    assert [(w["device"], w["state"]) for w in old["workers"]] == [("cpu:0", "draining")]
    assert (new["retired"], new["served"], new["latest"], new["queued"]) == (False, True, True, 1)
    assert [(w["device"], w["state"]) for w in new["workers"]] == [
        ("cpu:0", "loaded"),
        ("cpu:1", "loading"),
    ]
    worker = new["workers"][0]
    assert (worker["worker"], worker["host"], worker["pid"]) == ("host/7/cpu:0/abc", "host", 7)
    assert ISO_UTC.match(worker["since"])
    assert (count["served"], count["workers"], count["latest"]) == (False, [], True)
    assert body["load_errors"] == [
        {
            "model": "mlp",
            "version": 3,
            "path": "/models/mlp/3",
            "error": "ValueError: corrupt",
            "worker": "host/7/cpu:2/abc",
            "host": "host",
            "pid": 7,
            "device": "cpu:2",
            "state": "failed",
            "since": body["load_errors"][0]["since"],
        }
    ]


async def test_a_submission_without_a_version_gets_the_latest_version_a_live_worker_loaded(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    report(sessions, "cpu:0", ("mlp", 1, PresenceState.LOADED), ("mlp", 2, PresenceState.LOADING))

    response = await client.post("/v1/jobs", json={"model": "mlp", "inputs": [ROW]})

    assert response.status_code == 202, response.text
    assert response.json()["version"] == 1  # 2 is registered, but no worker can run it yet


async def test_a_submission_naming_a_retired_version_is_404_and_names_the_served_ones(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    report(sessions, "cpu:0", ("mlp", 1, PresenceState.DRAINING), ("mlp", 2, PresenceState.LOADED))
    with sessions.begin() as session:
        registry.retire(session=session, name="mlp", version=1)

    response = await client.post("/v1/jobs", json={"model": "mlp", "version": 1, "inputs": [ROW]})

    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert "version 1 is retired" in error["message"] and "[2]" in error["message"]
