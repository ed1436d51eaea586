"""API keys and tenants: who may call, and whose jobs each caller sees.

Every route but /healthz and /readyz takes `Authorization: Bearer <key>`. A job belongs to the
tenant whose key submitted it; another tenant's job is 404, never 403; an admin key sees all.
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, presence, tenants
from db.clock import utcnow
from db.models import JobStatus, PresenceState
from tests.api.conftest import Api, OpenApi, finish_job, read_job

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

X = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
OUTPUTS = {"y": np.zeros((1, 2), dtype=np.float32)}


async def submit(api: Api, headers: dict[str, str], **extra: str) -> str:
    response = await api.client.post("/v1/jobs", json=X, headers={**headers, **extra})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


# Who may call


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Basic dXNlcjpwYXNz", "Bearer not-a-key", "Bearer tff_0123456789ab_x"],
)
async def test_a_request_without_a_valid_key_is_401_and_stores_nothing(
    api: Api, sessions: Sessions, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    del api.client.headers["Authorization"]

    response = await api.client.post("/v1/jobs", json=X, headers=headers)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert "Bearer" in response.json()["error"]["message"]
    assert response.headers["WWW-Authenticate"] == "Bearer"
    with sessions() as session:
        assert jobs.count_queued(session=session) == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/01890000-0000-7000-8000-000000000000"),
        ("POST", "/v1/jobs/status"),
        ("POST", "/v1/jobs/01890000-0000-7000-8000-000000000000/cancel"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
    ],
)
async def test_every_route_but_the_probes_takes_a_key(api: Api, method: str, path: str) -> None:
    del api.client.headers["Authorization"]

    response = await api.client.request(method, path, json={"ids": ["x"]})

    assert response.status_code == 401, response.text


async def test_the_probes_and_the_docs_are_open(api: Api) -> None:
    del api.client.headers["Authorization"]

    for path in ("/healthz", "/readyz", "/openapi.json"):
        assert (await api.client.get(path)).status_code == 200, path


async def test_a_revoked_key_is_refused(api: Api) -> None:
    with api.sessions.begin() as session:
        made = tenants.create_key(session=session, tenant="acme")
        tenants.revoke_key(session=session, prefix=made.row.prefix)

    response = await api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {made.key}"})

    assert response.status_code == 401


async def test_metrics_take_an_admin_key(api: Api) -> None:
    tenant = api.key("acme")

    assert (await api.client.get("/metrics", headers=tenant)).status_code == 403
    assert (await api.client.get("/metrics")).status_code == 200


async def test_metrics_can_be_made_public(open_api: OpenApi) -> None:
    async with open_api(metrics_public=True) as api:
        del api.client.headers["Authorization"]
        assert (await api.client.get("/metrics")).status_code == 200


async def test_with_auth_off_every_request_is_the_default_tenants_admin(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(auth=False) as api:
        del api.client.headers["Authorization"]
        job_id = await submit(api, {})
        listed = (await api.client.get("/v1/jobs")).json()["jobs"]

    assert [job["id"] for job in listed] == [job_id]
    assert read_job(sessions, job_id).tenant == "default"


# Whose jobs


async def test_a_job_belongs_to_the_tenant_whose_key_submitted_it(
    api: Api, sessions: Sessions
) -> None:
    job_id = await submit(api, api.key("acme"))

    assert read_job(sessions, job_id).tenant == "acme"


async def test_another_tenants_job_is_not_found_anywhere(api: Api, sessions: Sessions) -> None:
    acme, globex = api.key("acme"), api.key("globex")
    job_id = await submit(api, acme)

    get = await api.client.get(f"/v1/jobs/{job_id}", headers=globex)
    waited = await api.client.get(f"/v1/jobs/{job_id}", params={"wait": 1}, headers=globex)
    status = await api.client.post("/v1/jobs/status", json={"ids": [job_id]}, headers=globex)
    cancel = await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=globex)
    listed = await api.client.get("/v1/jobs", headers=globex)

    for response in (get, waited, status, cancel):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "job_not_found"
    assert listed.json()["jobs"] == []
    assert read_job(sessions, job_id).status == JobStatus.QUEUED  # the cancel did nothing
    own = await api.client.get(f"/v1/jobs/{job_id}", headers=acme)
    assert own.status_code == 200


async def test_a_status_read_mixing_in_another_tenants_id_is_404_naming_only_that_id(
    api: Api,
) -> None:
    acme, globex = api.key("acme"), api.key("globex")
    mine, theirs = await submit(api, acme), await submit(api, globex)

    response = await api.client.post("/v1/jobs/status", json={"ids": [mine, theirs]}, headers=acme)

    assert response.status_code == 404
    assert theirs in response.json()["error"]["message"]
    assert mine not in response.json()["error"]["message"]


async def test_an_admin_key_sees_lists_and_cancels_every_tenants_jobs(api: Api) -> None:
    acme, globex = api.key("acme"), api.key("globex")
    a, g = await submit(api, acme), await submit(api, globex)

    listed = (await api.client.get("/v1/jobs")).json()["jobs"]
    canceled = await api.client.post(f"/v1/jobs/{g}/cancel")

    assert {job["id"] for job in listed} == {a, g}
    assert canceled.json()["status"] == "canceled"


async def test_idempotency_keys_are_per_tenant(api: Api) -> None:
    acme, globex = api.key("acme"), api.key("globex")

    first = await submit(api, acme, **{"Idempotency-Key": "order-1"})
    again = await submit(api, acme, **{"Idempotency-Key": "order-1"})
    other = await submit(api, globex, **{"Idempotency-Key": "order-1"})

    assert first == again
    assert other != first


async def test_a_tenant_does_not_see_which_worker_ran_its_job(api: Api, sessions: Sessions) -> None:
    acme = api.key("acme")
    job_id = await submit(api, acme)
    finish_job(sessions, job_id, OUTPUTS)

    as_tenant = (await api.client.get(f"/v1/jobs/{job_id}", headers=acme)).json()
    as_admin = (await api.client.get(f"/v1/jobs/{job_id}")).json()

    assert as_tenant["worker"] is None
    assert as_admin["worker"] == "test-worker"


async def test_a_tenant_sees_the_models_but_not_the_hosts_processes_or_paths(
    api: Api, sessions: Sessions
) -> None:
    with sessions.begin() as session:
        child = presence.Child(id="host-a/42/cpu:0/abc", host="host-a", pid=42, device="cpu:0")
        holdings = [
            presence.Holding("mlp", 1, PresenceState.LOADED, "/srv/models/mlp/1", utcnow()),
            presence.Holding("mlp", 2, PresenceState.FAILED, "/srv/models/mlp/2", utcnow(), "x"),
        ]
        presence.report(session=session, child=child, holdings=holdings)

    as_tenant = (await api.client.get("/v1/models", headers=api.key("acme"))).json()
    as_admin = (await api.client.get("/v1/models")).json()

    assert "host-a" not in str(as_tenant) and "/srv/models" not in str(as_tenant)
    assert "mlp" in {model["name"] for model in as_tenant["models"]}
    assert "host-a" in str(as_admin)


async def test_keys_are_looked_up_once_per_cache_period(api: Api, sessions: Sessions) -> None:
    acme = api.key("acme")
    await submit(api, acme)
    with sessions.begin() as session:  # revoked after its first use: cached as valid for 5 s
        tenants.revoke_key(session=session, prefix=acme["Authorization"].split("_")[1])

    assert (await api.client.get("/v1/jobs", headers=acme)).status_code == 200


def test_a_key_is_stored_as_a_hash_never_in_the_clear(sessions: Sessions) -> None:
    with sessions.begin() as session:
        made = tenants.create_key(session=session, tenant="acme")
    with sessions() as session:
        (row,) = tenants.list_keys(session=session, tenant="acme")

    assert made.key.startswith(f"tff_{row.prefix}_")
    assert made.key not in str(vars(row))
    assert row.digest == tenants.digest(made.key)


def test_authenticate_refuses_a_right_prefix_with_a_wrong_secret(sessions: Sessions) -> None:
    with sessions.begin() as session:
        made = tenants.create_key(session=session, tenant="acme", admin=True)
    forged = made.key[:-1] + ("A" if made.key[-1] != "A" else "B")

    with sessions() as session:
        assert tenants.authenticate(session=session, key=made.key) == tenants.Caller(
            tenant="acme", admin=True, key_prefix=made.row.prefix
        )
        assert tenants.authenticate(session=session, key=forged) is None


@pytest.mark.parametrize("name", ["", "Acme", "a b", "-x", "x" * 65, "ümlaut"])
def test_a_tenant_name_that_is_not_a_plain_slug_is_refused(sessions: Sessions, name: str) -> None:
    from tffleet.errors import InvalidRequest

    with sessions.begin() as session, pytest.raises(InvalidRequest, match="tenant"):
        tenants.create_key(session=session, tenant=name)


def test_auth_cannot_be_switched_off_beyond_loopback() -> None:
    from tffleet.settings import Settings

    assert Settings(auth=False, api_host="127.0.0.1").auth is False
    assert Settings(auth=False, api_host="::1").auth is False
    for host in ("0.0.0.0", "10.1.2.3", "api.example.com"):
        with pytest.raises(ValueError, match="TFFLEET_AUTH=false is refused"):
            Settings(auth=False, api_host=host)


async def test_a_stranger_costs_no_body_parsing(api: Api) -> None:
    del api.client.headers["Authorization"]

    response = await api.client.post(
        "/v1/jobs", content=b"{" * 100, headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 401  # not 400: the key is checked before the body is read
