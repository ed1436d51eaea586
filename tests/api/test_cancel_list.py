"""POST /v1/jobs/{id}/cancel and GET /v1/jobs (filters and cursor pagination)."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import JobStatus
from tests.api.conftest import ISO_UTC, finish_job, read_job

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

OUTPUTS = {"y": np.zeros((1, 3), dtype=np.float32)}
MISSING = "01890000-0000-7000-8000-000000000000"


async def submit(client: httpx.AsyncClient, model: str = "mlp") -> str:
    inputs = [[1, 2]] if model == "count" else [[1.0, 2.0, 3.0, 4.0]]
    response = await client.post("/v1/jobs", json={"model": model, "inputs": inputs})
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


# Cancel


async def test_cancel_a_queued_job(client: httpx.AsyncClient, sessions: Sessions) -> None:
    job_id = await submit(client)

    response = await client.post(f"/v1/jobs/{job_id}/cancel")

    assert response.status_code == 200
    job = response.json()
    assert job["id"] == job_id and job["status"] == "canceled"
    assert ISO_UTC.match(job["finished_at"])
    assert read_job(sessions, job_id).status == JobStatus.CANCELED
    assert (await client.get(f"/v1/jobs/{job_id}")).json()["status"] == "canceled"


async def test_cancel_a_running_job_fences_out_its_result(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = await submit(client)
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)

    response = await client.post(f"/v1/jobs/{job_id}/cancel")

    assert response.json()["status"] == "canceled"
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, b"late")]) == 0
    assert (await client.get(f"/v1/jobs/{job_id}")).json()["status"] == "canceled"


async def test_cancel_twice_is_not_an_error(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    first = await client.post(f"/v1/jobs/{job_id}/cancel")

    second = await client.post(f"/v1/jobs/{job_id}/cancel")

    assert second.status_code == 200
    assert second.json()["status"] == "canceled"
    assert second.json()["finished_at"] == first.json()["finished_at"]


async def test_cancel_a_succeeded_job_is_409(client: httpx.AsyncClient, sessions: Sessions) -> None:
    job_id = await submit(client)
    finish_job(sessions, job_id, OUTPUTS)

    response = await client.post(f"/v1/jobs/{job_id}/cancel")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "job_finished"
    assert "succeeded" in response.json()["error"]["message"]
    assert read_job(sessions, job_id).status == JobStatus.SUCCEEDED


async def test_cancel_an_unknown_job_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post(f"/v1/jobs/{MISSING}/cancel")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"


# List


async def list_all(client: httpx.AsyncClient, **params: Any) -> list[list[str]]:
    """Follow `next_cursor` to the end; returns the ids page by page."""
    pages: list[list[str]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = await client.get("/v1/jobs", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        assert set(body) == {"jobs", "next_cursor"}
        pages.append([job["id"] for job in body["jobs"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 20, "pagination does not end"


@pytest.mark.both_databases
async def test_list_pages_through_every_job_newest_first(client: httpx.AsyncClient) -> None:
    submitted = [await submit(client) for _ in range(7)]

    pages = await list_all(client, limit=3)

    assert [len(page) for page in pages] == [3, 3, 1]
    assert [job_id for page in pages for job_id in page] == submitted[::-1]


async def test_list_with_a_limit_equal_to_the_count_has_no_next_page(
    client: httpx.AsyncClient,
) -> None:
    for _ in range(3):
        await submit(client)

    body = (await client.get("/v1/jobs", params={"limit": 3})).json()

    assert len(body["jobs"]) == 3 and body["next_cursor"] is None


async def test_list_filters_by_status_and_model(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    mlp = [await submit(client) for _ in range(4)]
    count = [await submit(client, "count") for _ in range(3)]
    for job_id in (mlp[0], count[1]):
        await client.post(f"/v1/jobs/{job_id}/cancel")
    finish_job(sessions, mlp[2], OUTPUTS)

    def flat(pages: list[list[str]]) -> list[str]:
        return [job_id for page in pages for job_id in page]

    assert flat(await list_all(client, model="count", limit=2)) == count[::-1]
    assert flat(await list_all(client, status="canceled")) == [count[1], mlp[0]]
    assert flat(await list_all(client, status="queued", model="mlp")) == [mlp[3], mlp[1]]
    assert flat(await list_all(client, status="succeeded")) == [mlp[2]]
    assert flat(await list_all(client, model="nosuch")) == []


async def test_listed_jobs_have_the_job_shape(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)

    (job,) = (await client.get("/v1/jobs")).json()["jobs"]

    assert job == (await client.get(f"/v1/jobs/{job_id}")).json()


@pytest.mark.parametrize(
    ("params", "status", "named"),
    [
        ({"status": "sleeping"}, 422, "status"),
        ({"limit": "0"}, 422, "limit"),
        ({"limit": "501"}, 422, "limit"),
        ({"cursor": "not-a-cursor"}, 400, "cursor"),
    ],
    ids=["unknown_status", "limit_zero", "limit_too_big", "bad_cursor"],
)
async def test_list_refuses_bad_parameters(
    client: httpx.AsyncClient, params: dict[str, str], status: int, named: str
) -> None:
    response = await client.get("/v1/jobs", params=params)

    assert response.status_code == status
    assert named in response.json()["error"]["message"]
