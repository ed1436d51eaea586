"""Webhooks end to end: a real API, worker and sweeper (which delivers them) over PostgreSQL and
a Redis of the test's own, with receivers on 127.0.0.1 (TFFLEET_WEBHOOK_ALLOW_PRIVATE=true).

- A receiver that answers 503 twice to each delivery gets exactly one accepted delivery per
  event, `start` and `completed`, each under one webhook-id on every attempt, each signature
  checked by the reference Standard Webhooks library, the `completed` body the job as GET shows.
- Deliveries outlive the processes: with no sweeper running jobs end and their deliveries wait
  in the outbox; the API, the worker and Redis restart; the sweeper then delivers every one.
- A tenant whose receiver takes connections and never answers delays nothing else: jobs end at
  their usual pace, and another tenant's receiver gets its deliveries at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import standardwebhooks

from db import tenants
from db.engine import make_engine, make_sessionmaker
from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.models import build_mlp
from tests.receivers import Receiver, black_hole
from tests.services import PrivateRedis

pytestmark = pytest.mark.slow

ENV = {
    "TFFLEET_WEBHOOK_ALLOW_PRIVATE": "true",
    "TFFLEET_WEBHOOK_BACKOFF_S": "0.2",
    "TFFLEET_WEBHOOK_POLL_S": "0.1",
    "TFFLEET_SWEEP_INTERVAL_S": "0.5",
}
X = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]


@pytest.fixture
def fleet(
    fleet_factory: Callable[..., Fleet],
    postgres_url: str,
    private_redis: PrivateRedis,
    tmp_path: Path,
) -> Fleet:
    clean_database(postgres_url)
    build_mlp(tmp_path / "models")
    return fleet_factory(
        postgres_url,
        tmp_path / "models",
        devices="cpu:1",
        broker_url=private_redis.url,
        extra_env=ENV,
    )


def key_of(fleet: Fleet, tenant: str) -> dict[str, str]:
    engine = make_engine(fleet.database_url)
    with make_sessionmaker(engine).begin() as session:
        made = tenants.create_key(session=session, tenant=tenant)
    engine.dispose()
    return {"Authorization": f"Bearer {made.key}"}


def submit(client: httpx.Client, url: str, events: list[str], **headers: str) -> str:
    body = {"model": "mlp", "inputs": {"x": X}, "webhook": url, "webhook_events": events}
    response = client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def ended(client: httpx.Client, job_id: str, **headers: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(
            f"/v1/jobs/{job_id}", params={"wait": 5}, headers=headers
        ).json()
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
    pytest.fail(f"job {job_id} did not end")


def test_each_event_is_accepted_once_after_two_503s_and_verifies(fleet: Fleet) -> None:
    fleet.start_api()
    fleet.start_worker()
    fleet.start_sweeper()
    acme = key_of(fleet, "acme")
    with Receiver(fail_each=2) as receiver, fleet.http(timeout=60) as client:
        secret = client.get("/v1/webhooks/secret", headers=acme).json()["secret"]
        job_id = submit(client, receiver.url, ["start", "completed"], **acme)
        job = ended(client, job_id, **acme)
        accepted = receiver.wait_for(2)
        time.sleep(2)  # long enough for a duplicate to show up, if one were sent
        assert len(receiver.accepted()) == 2
    webhook = standardwebhooks.Webhook(secret)
    by_id: dict[str, list[Any]] = {}
    for hit in receiver.received:
        assert webhook.verify(hit.body, hit.headers)["id"] == job_id
        by_id.setdefault(hit.headers["webhook-id"], []).append(hit)
    assert sorted(len(hits) for hits in by_id.values()) == [3, 3]  # 503, 503, 200 each
    bodies = {hit.json["status"]: hit.json for hit in accepted}
    assert set(bodies) == {"running", "succeeded"}
    assert bodies["succeeded"] == job  # the job exactly as GET shows it
    assert bodies["running"]["finished_at"] is None and bodies["running"]["outputs"] is None
    assert bodies["running"]["started_at"] == job["started_at"]


def test_deliveries_outlive_a_restart_of_the_api_the_worker_and_redis(
    fleet: Fleet, private_redis: PrivateRedis
) -> None:
    fleet.start_api()
    fleet.start_worker()  # no sweeper: nothing delivers yet
    with Receiver() as receiver:
        with fleet.http(timeout=60) as client:
            ids = [submit(client, receiver.url, ["start", "completed"]) for _ in range(3)]
            for job_id in ids:
                assert ended(client, job_id)["status"] == "succeeded"
        fleet.stop("api")
        fleet.stop("worker")
        private_redis.restart()
        fleet.start_api()
        fleet.start_worker()
        fleet.start_sweeper()
        got = receiver.wait_for(6, timeout_s=30)
    assert receiver.received == got  # each accepted the first time, none twice
    assert sorted((hit.json["id"], hit.json["status"]) for hit in got) == sorted(
        (job_id, status) for job_id in ids for status in ("running", "succeeded")
    )


def test_a_dead_receiver_delays_no_job_and_no_other_tenant(fleet: Fleet) -> None:
    fleet.start_api()
    fleet.start_worker()
    fleet.start_sweeper()
    dead, live = key_of(fleet, "dead"), key_of(fleet, "live")
    with black_hole() as hole, Receiver() as receiver, fleet.http(timeout=60) as client:
        started = time.monotonic()
        dead_ids = [submit(client, hole, ["start", "completed"], **dead) for _ in range(30)]
        for job_id in dead_ids:
            assert ended(client, job_id, **dead)["status"] == "succeeded"
        dead_s = time.monotonic() - started
        # The dead tenant's attempts now hang (TFFLEET_WEBHOOK_READ_TIMEOUT_S, 10 s) in its slots.
        job_id = submit(client, receiver.url, ["completed"], **live)
        job = ended(client, job_id, **live)
        finished = time.monotonic()
        (got,) = receiver.wait_for(1, timeout_s=10)
    assert got.at - finished < 2.0, got.at - finished
    assert got.json == job
    # 30 one-sample jobs on one CPU child: seconds, whatever their receiver does.
    assert dead_s < 20, dead_s
    assert np.isfinite(np.array(job["outputs"]["output_0"], dtype=np.float32)).all()
