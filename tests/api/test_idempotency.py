"""POST /v1/jobs with an Idempotency-Key: one job per key, whatever the retries and races."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from tests.api.conftest import (
    Api,
    OpenApi,
    Publication,
    count_jobs,
    envelope,
    finish_job,
    queued_messages,
    task_args,
)
from tffleet import tensors
from tffleet.errors import IdempotencyKeyReused

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

ROW = [1.0, 2.0, 3.0, 4.0]
BODY = {"model": "mlp", "inputs": {"x": [ROW]}}


async def post(client: httpx.AsyncClient, body: dict[str, Any], key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return await client.post("/v1/jobs", json=body, headers=headers)


def published_ids(broker: redis.Redis) -> list[str]:
    return [i for m in queued_messages(broker, "tffleet.mlp") for i in task_args(m)[2]]


# The same request again


@pytest.mark.both_databases
async def test_the_same_key_and_body_again_is_the_same_job_stored_and_published_once(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    first = await post(client, BODY, "order-17")
    again = await post(client, BODY, "order-17")

    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert first.headers["Idempotent-Replayed"] == "false"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert count_jobs(sessions) == 1
    assert published_ids(broker) == [first.json()["id"]]


async def test_the_key_compares_what_the_request_means_not_how_it_is_spelled(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    # Lists, a bare tensor, a binary envelope, the default version spelled out: one request.
    array = np.array([ROW], dtype=np.float32)
    spellings: list[dict[str, Any]] = [
        {"model": "mlp", "inputs": {"x": [ROW]}},
        {"model": "mlp", "inputs": [[1, 2, 3, 4]]},
        {"model": "mlp", "version": 2, "inputs": {"x": envelope(array)}, "priority": 0},
    ]

    responses = [await post(client, body, "same-meaning") for body in spellings]

    assert [r.status_code for r in responses] == [202] * 3
    assert len({r.json()["id"] for r in responses}) == 1
    assert count_jobs(sessions) == 1


async def test_a_replay_after_the_job_finished_answers_with_the_job_as_it_is_now(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    first = (await post(client, BODY, "done-once")).json()
    finish_job(sessions, first["id"], {"y": np.zeros((1, 3), np.float32)})

    again = await post(client, BODY, "done-once")

    assert again.status_code == 202
    assert again.json()["id"] == first["id"]
    assert again.json()["status"] == "succeeded" and again.json()["attempts"] == 1
    assert count_jobs(sessions) == 1
    assert published_ids(broker) == [first["id"]]


async def test_different_keys_are_different_jobs(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    a = await post(client, BODY, "key-a")
    b = await post(client, BODY, "key-b")
    no_key = await post(client, BODY, None)

    assert len({a.json()["id"], b.json()["id"], no_key.json()["id"]}) == 3
    assert "Idempotent-Replayed" not in no_key.headers
    assert count_jobs(sessions) == 3


# The same key for a different request


@pytest.mark.both_databases
@pytest.mark.parametrize(
    "other",
    [
        {"model": "mlp", "inputs": {"x": [[9.0, 2.0, 3.0, 4.0]]}},
        {"model": "mlp", "inputs": {"x": [ROW]}, "priority": 1},
        {"model": "mlp", "version": 1, "inputs": {"x": [ROW]}},
        {"model": "mlp", "inputs": {"x": [ROW, ROW]}},
        {"model": "count", "inputs": [[1, 2, 3, 4]]},
    ],
    ids=["inputs", "priority", "version", "batch", "model"],
)
async def test_the_same_key_with_a_different_body_is_409_and_stores_nothing_new(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis, other: dict[str, Any]
) -> None:
    first = await post(client, BODY, "reused")

    response = await post(client, other, "reused")

    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == IdempotencyKeyReused.code
    assert "'reused'" in error["message"] and "different request" in error["message"]
    assert count_jobs(sessions) == 1
    assert published_ids(broker) == [first.json()["id"]]
    # The key still means the first request.
    assert (await post(client, BODY, "reused")).json()["id"] == first.json()["id"]


async def test_an_invalid_body_with_a_key_is_refused_before_the_key_is_looked_at(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    bad = await post(client, {"model": "mlp", "inputs": {"x": [[1, 2]]}}, "k1")
    good = await post(client, BODY, "k1")

    assert bad.status_code == 422
    assert good.status_code == 202 and good.headers["Idempotent-Replayed"] == "false"
    assert count_jobs(sessions) == 1


@pytest.mark.parametrize(
    "key",
    ["", "   ", "has space", "x" * 129, "naïve"],
    ids=["empty", "blank", "space", "long", "utf8"],
)
async def test_a_malformed_key_is_400_and_stores_nothing(
    client: httpx.AsyncClient, sessions: Sessions, key: str
) -> None:
    response = await client.post(
        "/v1/jobs", json=BODY, headers=[(b"Idempotency-Key", key.encode())]
    )

    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["error"]["message"]
    assert count_jobs(sessions) == 0


# Races: many requests with one key at once


@pytest.mark.both_databases
async def test_eight_parallel_submits_with_one_key_make_exactly_one_job(
    publications: list[Publication],
    client: httpx.AsyncClient,
    sessions: Sessions,
    broker: redis.Redis,
) -> None:
    responses = await asyncio.gather(*(post(client, BODY, "racing") for _ in range(8)))

    assert [r.status_code for r in responses] == [202] * 8
    (job_id,) = {r.json()["id"] for r in responses}
    assert sorted(r.headers["Idempotent-Replayed"] for r in responses) == ["false"] + ["true"] * 7
    assert count_jobs(sessions) == 1
    assert [p.job_ids for p in publications] == [[job_id]]
    assert published_ids(broker) == [job_id]


async def test_parallel_submits_through_two_api_processes_make_exactly_one_job(
    open_api: OpenApi, sessions: Sessions, broker: redis.Redis
) -> None:
    # Two apps: two ingestors, two connection pools, so the key races across transactions.
    async with open_api() as one, open_api() as two:
        apis: list[Api] = [one, two]
        responses = await asyncio.gather(
            *(post(apis[i % 2].client, BODY, "two-processes") for i in range(8))
        )

    assert [r.status_code for r in responses] == [202] * 8
    (job_id,) = {r.json()["id"] for r in responses}
    assert [r.headers["Idempotent-Replayed"] for r in responses].count("false") == 1
    assert count_jobs(sessions) == 1
    assert published_ids(broker) == [job_id]


@pytest.mark.both_databases
async def test_a_conflict_does_not_fail_the_submits_coalesced_with_it(
    client: httpx.AsyncClient, sessions: Sessions
) -> None:
    first = await post(client, BODY, "taken")
    others = [{"model": "mlp", "inputs": [[float(i), 0, 0, 0]]} for i in range(6)]

    responses = await asyncio.gather(
        post(client, {"model": "mlp", "inputs": [[5, 5, 5, 5]]}, "taken"),
        *(post(client, body, None) for body in others),
        post(client, others[0], "fresh"),
        post(client, BODY, "taken"),
    )

    assert [r.status_code for r in responses] == [409] + [202] * 8
    assert responses[-1].json()["id"] == first.json()["id"]
    assert count_jobs(sessions) == 1 + 6 + 1


@pytest.mark.both_databases
def test_one_transaction_stores_new_keys_replays_known_ones_and_refuses_reused_ones(
    sessions: Sessions,
) -> None:
    def job(i: int, key: str, request_hash: str) -> jobs.NewJob:
        inputs = tensors.pack({"x": np.full((1, 4), i, np.float32)})
        return jobs.NewJob("mlp", 2, 1, inputs, idempotency_key=key, request_hash=request_hash)

    with sessions.begin() as session:
        (before,) = jobs.create_idempotent(session=session, requests=[[job(0, "old", "h-old")]])
    assert isinstance(before, jobs.Submitted)

    with sessions.begin() as session:
        outcomes = jobs.create_idempotent(
            session=session,
            requests=[
                [job(1, "new", "h-new"), job(2, "new 1", "h-new")],  # a bulk request of two
                [job(3, "old", "h-other")],  # reused for something else
                [job(0, "old", "h-old")],  # a replay
                [job(4, "new", "h-new"), job(5, "new 1", "h-new")],  # the bulk, again at once
                [job(6, "fresh", "h-other"), job(7, "old", "h-other")],  # half new, half reused
            ],
        )

    new, reused, replay, new_again, half = outcomes
    assert isinstance(new, jobs.Submitted) and len(new.created) == 2 and not new.replayed
    assert isinstance(reused, IdempotencyKeyReused) and isinstance(half, IdempotencyKeyReused)
    assert isinstance(replay, jobs.Submitted) and replay.replayed
    assert [row.id for row in replay.jobs] == [row.id for row in before.jobs]
    assert isinstance(new_again, jobs.Submitted) and new_again.replayed
    assert [row.id for row in new_again.jobs] == new.created
    # The refused half-new request left nothing; the bulk's inputs are its own, in order.
    assert count_jobs(sessions) == 3
    with sessions() as session:
        stored = jobs.get_many(session=session, job_ids=new.created)
        firsts = {row.id: tensors.unpack(row.inputs)["x"][0, 0] for row in stored}
    assert [firsts[job_id] for job_id in new.created] == [1, 2]


# Many jobs in one request, one key


BULK = {"jobs": [BODY, {"model": "mlp", "inputs": [[5, 6, 7, 8]]}]}


@pytest.mark.both_databases
async def test_a_bulk_request_sent_again_with_its_key_gets_the_same_jobs(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis
) -> None:
    first = await post(client, BULK, "bulk-1")
    again = await post(client, BULK, "bulk-1")

    assert first.status_code == again.status_code == 202
    ids = [job["id"] for job in first.json()["jobs"]]
    assert [job["id"] for job in again.json()["jobs"]] == ids
    assert again.headers["Idempotent-Replayed"] == "true"
    assert count_jobs(sessions) == 2
    assert published_ids(broker) == ids


@pytest.mark.both_databases
@pytest.mark.parametrize(
    "other",
    [
        {"jobs": [*BULK["jobs"], BODY]},  # one more job: stored, then taken back
        {"jobs": BULK["jobs"][:1]},  # one job fewer
        BODY,  # a single job under the bulk's key
    ],
    ids=["longer", "shorter", "single"],
)
async def test_a_bulk_key_reused_for_other_jobs_is_409_and_stores_nothing_new(
    client: httpx.AsyncClient, sessions: Sessions, broker: redis.Redis, other: dict[str, Any]
) -> None:
    first = await post(client, BULK, "bulk-2")

    response = await post(client, other, "bulk-2")

    assert response.status_code == 409
    assert count_jobs(sessions) == 2
    assert published_ids(broker) == [job["id"] for job in first.json()["jobs"]]
