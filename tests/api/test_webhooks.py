"""POST /v1/jobs `webhook` and `webhook_events` (JSON, bulk and binary bodies, their 422s and the
address check), their place in the idempotency hash, and GET /v1/webhooks/secret."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import orjson
import pytest
from sqlalchemy.orm import Session, sessionmaker

from api.submission import request_hash
from db import jobs, webhooks
from tests.api.conftest import Api, OpenApi, read_job
from tffleet import tensors

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

X = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
PUBLIC = "https://93.184.216.34/hooks/tffleet"  # an address literal: no resolver in the tests


async def test_a_job_keeps_its_webhook_and_events(api: Api, sessions: Sessions) -> None:
    response = await api.client.post(
        "/v1/jobs", json={**X, "webhook": PUBLIC, "webhook_events": ["start", "completed"]}
    )
    assert response.status_code == 202, response.text
    job = read_job(sessions, response.json()["id"])
    assert job.webhook == PUBLIC and job.webhook_events == webhooks.bits(["start", "completed"])
    assert "webhook" not in response.json()  # the job's shape is unchanged

    default = await api.client.post("/v1/jobs", json={**X, "webhook": PUBLIC})
    assert read_job(sessions, default.json()["id"]).webhook_events == webhooks.Event.COMPLETED
    plain = await api.client.post("/v1/jobs", json=X)
    stored = read_job(sessions, plain.json()["id"])
    assert stored.webhook is None and stored.webhook_events is None


async def test_bulk_and_binary_submits_take_them_too(api: Api, sessions: Sessions) -> None:
    response = await api.client.post(
        "/v1/jobs",
        json={"jobs": [X, {**X, "webhook": PUBLIC, "webhook_events": ["start"]}]},
    )
    assert response.status_code == 202, response.text
    first, second = (read_job(sessions, job["id"]) for job in response.json()["jobs"])
    assert first.webhook is None
    assert (second.webhook, second.webhook_events) == (PUBLIC, webhooks.Event.START)

    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((1, 4), np.float32))
    binary = await api.client.post(
        "/v1/jobs",
        params={"model": "mlp", "webhook": PUBLIC, "webhook_events": "start,completed"},
        content=buffer.getvalue(),
        headers={"Content-Type": tensors.NPZ},
    )
    assert binary.status_code == 202, binary.text
    job = read_job(sessions, binary.json()["id"])
    assert job.webhook_events == webhooks.bits(["start", "completed"])


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"webhook": "ftp://example.com/x"}, "webhook:"),
        ({"webhook": "not a url"}, "webhook:"),
        ({"webhook": "http://127.0.0.1:9000/x"}, "webhook:"),
        ({"webhook": "http://localhost/x"}, "webhook:"),
        ({"webhook": "http://10.0.0.7/x"}, "webhook:"),
        ({"webhook": "http://169.254.169.254/latest/meta-data"}, "webhook:"),
        ({"webhook": "http://[::1]/x"}, "webhook:"),
        ({"webhook": "http://[fd00::1]/x"}, "webhook:"),
        ({"webhook": PUBLIC, "webhook_events": ["finished"]}, "webhook_events"),
        ({"webhook": PUBLIC, "webhook_events": []}, "webhook_events"),
        ({"webhook_events": ["start"]}, "webhook_events"),
    ],
)
async def test_bad_webhooks_are_422_naming_the_field(
    api: Api, sessions: Sessions, fields: dict[str, object], named: str
) -> None:
    response = await api.client.post("/v1/jobs", json={**X, **fields})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"].startswith(named), response.text
    bulk = await api.client.post("/v1/jobs", json={"jobs": [X, {**X, **fields}]})
    assert bulk.status_code == 422
    assert bulk.json()["error"]["message"].startswith(f"jobs[1].{named}"), bulk.text


async def test_a_binary_submits_webhook_is_checked_as_well(api: Api) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((1, 4), np.float32))
    response = await api.client.post(
        "/v1/jobs",
        params={"model": "mlp", "webhook": "http://127.0.0.1/x"},
        content=buffer.getvalue(),
        headers={"Content-Type": tensors.NPZ},
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("webhook:")
    json_with_query = await api.client.post("/v1/jobs", json=X, params={"webhook": PUBLIC})
    assert json_with_query.status_code == 422


async def test_private_receivers_when_the_fleet_allows_them(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(webhook_allow_private=True) as api:
        response = await api.client.post(
            "/v1/jobs", json={**X, "webhook": "http://127.0.0.1:9000/hook"}
        )
    assert response.status_code == 202, response.text


async def test_the_webhook_is_part_of_the_idempotency_hash_only_when_given(api: Api) -> None:
    key = {"Idempotency-Key": "webhook-1"}
    first = await api.client.post("/v1/jobs", json={**X, "webhook": PUBLIC}, headers=key)
    again = await api.client.post("/v1/jobs", json={**X, "webhook": PUBLIC}, headers=key)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = await api.client.post(
        "/v1/jobs", json={**X, "webhook": PUBLIC, "webhook_events": ["start"]}, headers=key
    )
    assert other.status_code == 409
    without = await api.client.post("/v1/jobs", json=X, headers=key)
    assert without.status_code == 409

    # A request without a webhook hashes as it did before webhooks existed: keys stored then hold.
    job = jobs.NewJob(model="mlp", version=1, samples=1, inputs=b"in", priority=2, ttl_s=60)
    before = hashlib.sha256(orjson.dumps(["mlp", 1, 2, 60, 2]) + b"in").hexdigest()
    assert request_hash([job]) == before


@pytest.mark.both_databases
async def test_the_webhook_secret_is_the_callers_tenants(api: Api) -> None:
    admin = await api.client.get("/v1/webhooks/secret")
    assert admin.status_code == 200
    secret = admin.json()["secret"]
    assert secret.startswith("whsec_")
    assert (await api.client.get("/v1/webhooks/secret")).json()["secret"] == secret
    tenant = api.key("acme")
    acme = await api.client.get("/v1/webhooks/secret", headers=tenant)
    assert acme.json()["secret"].startswith("whsec_") and acme.json()["secret"] != secret
    again = await api.client.get("/v1/webhooks/secret", headers=tenant)
    assert again.json() == acme.json()
    nobody = await api.client.get("/v1/webhooks/secret", headers={"Authorization": "Bearer x"})
    assert nobody.status_code == 401
