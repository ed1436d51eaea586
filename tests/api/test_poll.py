"""GET /v1/jobs/{id}: the job as stored, outputs in both encodings, and the long-poll."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.api.conftest import ISO_UTC, Api, finish_job

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]
FinishLater = Callable[..., Any]

ROW = [1.0, 2.0, 3.0, 4.0]
# What the fake worker "computes" for mlp version 2 (three outputs per sample).
OUTPUTS = {"y": np.array([[0.5, -1.25, 3.0e-8]], dtype=np.float32)}


async def submit(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body = {"model": "mlp", "inputs": [ROW], **body}
    response = await client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job: dict[str, Any] = response.json()
    return job


async def test_a_queued_job_reads_back_as_submitted(client: httpx.AsyncClient) -> None:
    submitted = await submit(client, priority=-3)

    response = await client.get(f"/v1/jobs/{submitted['id']}")

    assert response.status_code == 200
    assert response.json() == submitted


async def test_a_succeeded_job_has_its_outputs_as_lists(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = (await submit(client))["id"]
    finish_job(sessions, job_id, OUTPUTS)

    job = (await client.get(f"/v1/jobs/{job_id}")).json()

    assert job["status"] == "succeeded" and job["attempts"] == 1 and job["error"] is None
    assert ISO_UTC.match(job["started_at"]) and ISO_UTC.match(job["finished_at"])
    assert job["created_at"] <= job["started_at"] <= job["finished_at"]
    assert job["outputs"] == {"y": OUTPUTS["y"].tolist()}


async def test_b64_encoding_returns_envelopes_of_the_stored_outputs(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = (await submit(client))["id"]
    outputs: dict[str, np.ndarray] = {
        "y": np.array([[0.1, -2.5, 7.0]], dtype=np.float32),
        "ids": np.array([[1, -(2**40)]], dtype=np.int64),
    }
    finish_job(sessions, job_id, outputs)

    job = (await client.get(f"/v1/jobs/{job_id}", params={"encoding": "b64"})).json()

    assert sorted(job["outputs"]) == ["ids", "y"]
    for name, expected in outputs.items():
        tensor = job["outputs"][name]
        assert tensor["dtype"] == expected.dtype.name
        assert tensor["shape"] == list(expected.shape)
        decoded = np.frombuffer(
            base64.b64decode(tensor["b64"]), dtype=expected.dtype.newbyteorder("<")
        ).reshape(tensor["shape"])
        np.testing.assert_array_equal(decoded, expected)  # bit for bit, not via JSON floats


async def test_unknown_job_is_404(client: httpx.AsyncClient) -> None:
    missing = "01890000-0000-7000-8000-000000000000"
    for params in ({}, {"wait": "0.2"}):
        response = await client.get(f"/v1/jobs/{missing}", params=params)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "job_not_found"
        assert missing in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "params",
    [{"wait": "31"}, {"wait": "-1"}, {"wait": "soon"}, {"encoding": "hex"}],
    ids=["wait_too_long", "wait_negative", "wait_not_a_number", "unknown_encoding"],
)
async def test_bad_query_parameters_are_422(
    client: httpx.AsyncClient, params: dict[str, str]
) -> None:
    job_id = (await submit(client))["id"]

    response = await client.get(f"/v1/jobs/{job_id}", params=params)

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"
    assert next(iter(params)) in response.json()["error"]["message"]


# Long-poll


async def test_long_poll_returns_soon_after_the_job_finishes(
    api: Api, finish_later: FinishLater, redis_url: str
) -> None:
    job_id = (await submit(api.client))["id"]
    started = time.monotonic()
    finish_later(job_id, OUTPUTS, delay_s=0.3, announce_to=redis_url)

    response = await api.client.get(f"/v1/jobs/{job_id}", params={"wait": "10"})

    elapsed = time.monotonic() - started
    assert response.json()["status"] == "succeeded"
    assert response.json()["outputs"] == {"y": OUTPUTS["y"].tolist()}
    # Woken by the announcement, not by the 2 s re-check nor the 10 s limit.
    assert 0.3 <= elapsed < 1.5, elapsed


async def test_long_poll_rechecks_the_database_when_an_announcement_is_lost(
    api: Api, finish_later: FinishLater
) -> None:
    api.state.waiter.recheck_s = 0.3  # a seam: the default is seconds
    job_id = (await submit(api.client))["id"]
    started = time.monotonic()
    finish_later(job_id, OUTPUTS, delay_s=0.2)  # never announced

    response = await api.client.get(f"/v1/jobs/{job_id}", params={"wait": "10"})

    assert response.json()["status"] == "succeeded"
    assert time.monotonic() - started < 2.0


async def test_long_poll_gives_up_after_wait_seconds(client: httpx.AsyncClient) -> None:
    job_id = (await submit(client))["id"]
    started = time.monotonic()

    response = await client.get(f"/v1/jobs/{job_id}", params={"wait": "0.5"})

    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.json()["status"] == "queued"
    assert 0.45 <= elapsed < 1.5, elapsed


async def test_long_poll_on_a_finished_job_returns_at_once(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    job_id = (await submit(client))["id"]
    finish_job(sessions, job_id, OUTPUTS)
    started = time.monotonic()

    response = await client.get(f"/v1/jobs/{job_id}", params={"wait": "10"})

    assert response.json()["status"] == "succeeded"
    assert time.monotonic() - started < 1.0


async def test_an_announcement_of_another_job_does_not_end_the_poll(
    api: Api, finish_later: FinishLater, redis_url: str
) -> None:
    watched = (await submit(api.client))["id"]
    other = (await submit(api.client))["id"]
    started = time.monotonic()
    finish_later(other, OUTPUTS, delay_s=0.1, announce_to=redis_url)

    response = await api.client.get(f"/v1/jobs/{watched}", params={"wait": "0.6"})

    assert response.json()["status"] == "queued"
    assert time.monotonic() - started >= 0.55


# Bulk status (an extension of the contract)


async def test_bulk_status_returns_jobs_in_the_order_asked(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    first, second = (await submit(client))["id"], (await submit(client))["id"]
    finish_job(sessions, second, OUTPUTS)

    response = await client.post("/v1/jobs/status", json={"ids": [second, first]})

    assert response.status_code == 200
    jobs = response.json()["jobs"]
    assert [(j["id"], j["status"]) for j in jobs] == [(second, "succeeded"), (first, "queued")]


async def test_bulk_status_with_an_unknown_id_is_404(client: httpx.AsyncClient) -> None:
    known = (await submit(client))["id"]
    missing = "01890000-0000-7000-8000-000000000000"

    response = await client.post("/v1/jobs/status", json={"ids": [known, missing]})

    assert response.status_code == 404
    assert missing in response.json()["error"]["message"]


async def test_bulk_status_until_all_holds_until_every_job_ended_and_reads_them_once_then(
    api: Api, finish_later: FinishLater, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = (await submit(api.client))["id"], (await submit(api.client))["id"]
    reads = []
    reader = api.state.reader

    async def counted(read: Any) -> Any:
        reads.append(read)
        return await reader(read)

    monkeypatch.setattr(api.state, "reader", counted)  # a seam: how often the database is read
    finish_later(first, OUTPUTS, delay_s=0.1, announce_to=redis_url)
    finish_later(second, OUTPUTS, delay_s=0.4, announce_to=redis_url)
    body = {"ids": [first, second], "wait": 10, "until": "all"}

    response = await api.client.post("/v1/jobs/status", json=body)

    assert response.status_code == 200
    assert [j["status"] for j in response.json()["jobs"]] == ["succeeded", "succeeded"]
    # Once before the hold, once when the last was announced: not at the first one's end.
    assert len(reads) == 2


async def test_bulk_status_until_all_answers_as_the_jobs_stand_when_the_wait_is_up(
    api: Api, finish_later: FinishLater, redis_url: str
) -> None:
    first, second = (await submit(api.client))["id"], (await submit(api.client))["id"]
    finish_later(first, OUTPUTS, delay_s=0.1, announce_to=redis_url)
    body = {"ids": [first, second], "wait": 0.6, "until": "all"}

    response = await api.client.post("/v1/jobs/status", json=body)

    jobs = response.json()["jobs"]
    assert [(j["id"], j["status"]) for j in jobs] == [(first, "succeeded"), (second, "queued")]
    assert jobs[0]["outputs"] == {"y": OUTPUTS["y"].tolist()}


async def test_bulk_status_until_is_any_or_all(client: httpx.AsyncClient) -> None:
    job_id = (await submit(client))["id"]

    response = await client.post("/v1/jobs/status", json={"ids": [job_id], "until": "some"})

    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("until:")


async def test_bulk_status_until_all_reads_the_database_again_once_the_channel_was_lost(
    api: Api, finish_later: FinishLater
) -> None:
    """What was announced while the channel was away is not known: a lost channel wakes every
    held request (`_wake_all`, as the listener does on losing it) to read the database."""
    api.state.waiter.recheck_s = 60  # a seam: only the loss may wake it
    ids = [(await submit(api.client))["id"] for _ in range(2)]
    finished = [finish_later(job_id, OUTPUTS, delay_s=0.2) for job_id in ids]  # not announced
    started = time.monotonic()

    async def lose_the_channel() -> None:
        while any(thread.is_alive() for thread in finished):
            await asyncio.sleep(0.05)
        api.state.waiter._wake_all()

    body = {"ids": ids, "wait": 20, "until": "all"}
    async with asyncio.TaskGroup() as group:
        group.create_task(lose_the_channel())
        response = await api.client.post("/v1/jobs/status", json=body)

    assert [j["status"] for j in response.json()["jobs"]] == ["succeeded", "succeeded"]
    assert time.monotonic() - started < 10
