"""One request never costs the fleet far more than it carries: each of these is a clear 4xx that
stores nothing (or, once stored, always the 202 its jobs were given)."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from api.ingest import JobReader
from tests.api.conftest import Api, OpenApi, count_jobs

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

ONE = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}


async def test_a_status_read_naming_one_id_many_times_is_422(api: Api) -> None:
    job_id = (await api.client.post("/v1/jobs", json=ONE)).json()["id"]

    response = await api.client.post("/v1/jobs/status", json={"ids": [job_id] * 300})

    assert response.status_code == 422
    assert "list each id once" in response.json()["error"]["message"]
    assert job_id in response.json()["error"]["message"]


async def test_an_id_far_longer_than_any_job_id_is_422_not_a_query(api: Api) -> None:
    long_id = "x" * 10_000

    get = await api.client.get(f"/v1/jobs/{long_id}")
    cancel = await api.client.post(f"/v1/jobs/{long_id}/cancel")
    status = await api.client.post("/v1/jobs/status", json={"ids": [long_id]})

    for response in (get, cancel, status):
        assert response.status_code == 422, response.text
        assert "64" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/{}"),
        ("GET", "/v1/jobs/{}/events"),
        ("POST", "/v1/jobs/{}/cancel"),
        ("POST", "/v1/jobs/{}/retry"),
        ("DELETE", "/v1/jobs/{}"),
        ("GET", "/v1/console/jobs/{}"),
    ],
)
async def test_an_id_holding_nul_is_404_on_every_route_that_takes_one(
    api: Api, method: str, path: str
) -> None:
    # No job's id holds NUL, and PostgreSQL refuses it in a query: not found, as any unknown id.
    response = await api.client.request(method, path.format("a%00b"))

    assert response.status_code == 404, response.text
    assert response.json()["error"] == {
        "code": "job_not_found",
        "message": "job 'a\\x00b' not found",
    }


@pytest.mark.parametrize("samples", [2**40, 2**31])
async def test_an_empty_envelope_claiming_huge_batches_is_422_not_a_stored_job(
    api: Api, sessions: Sessions, samples: int
) -> None:
    # `count` takes ids of any length ([-1, -1]): zero bytes describe [samples, 0] exactly.
    envelope = {"b64": base64.b64encode(b"").decode(), "dtype": "int32", "shape": [samples, 0]}

    response = await api.client.post("/v1/jobs", json={"model": "count", "inputs": envelope})

    assert response.status_code == 422, response.text
    assert f"inputs: {samples} samples" in response.json()["error"]["message"]
    assert count_jobs(sessions) == 0


async def test_submit_and_wait_answers_202_once_stored_even_if_the_database_fails_meanwhile(
    api: Api, sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    def database_gone(self: JobReader, requests: object) -> list[object]:
        raise OperationalError("SELECT", {}, Exception("server closed the connection"))

    # The seam: the reads of the wait fail; the insert before it went through.
    monkeypatch.setattr(JobReader, "_read", database_gone)
    response = await api.client.post("/v1/jobs", params={"wait": 1}, json={"jobs": [ONE, ONE]})

    assert response.status_code == 202, response.text
    assert [job["status"] for job in response.json()["jobs"]] == ["queued", "queued"]
    assert count_jobs(sessions) == 2


async def test_a_body_of_more_json_items_than_the_limit_is_413_before_it_is_parsed(
    open_api: OpenApi, sessions: Sessions
) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0]] * 5000  # 20,000 numbers, 100+ KB: parsed off the loop
    async with open_api(max_json_items=10_000, max_body_bytes=1 << 20) as api:
        refused = await api.client.post("/v1/jobs", json={"model": "mlp", "inputs": rows})
        envelope = {
            "b64": base64.b64encode(np.ones((5000, 4), np.float32).tobytes()).decode(),
            "dtype": "float32",
            "shape": [5000, 4],
        }
        accepted = await api.client.post("/v1/jobs", json={"model": "mlp", "inputs": envelope})

    assert refused.status_code == 413
    assert "binary envelopes" in refused.json()["error"]["message"]
    assert accepted.status_code == 202, accepted.text  # the same tensor, as bytes
    assert count_jobs(sessions) == 1


async def test_past_the_long_poll_limit_a_wait_is_answered_at_once(open_api: OpenApi) -> None:
    async with open_api(max_long_polls=0) as api:
        job_id = (await api.client.post("/v1/jobs", json=ONE)).json()["id"]
        started = asyncio.get_running_loop().time()
        response = await api.client.get(f"/v1/jobs/{job_id}", params={"wait": 20})
        held_s = asyncio.get_running_loop().time() - started

    assert response.status_code == 200
    assert response.json()["status"] == "queued"
    assert held_s < 10  # not held for its 20 s: the limit, not the machine's speed
