"""POST /v1/transforms and its reads, cancel and retry, on the real app over a real database, a
real Redis and a real store (a directory, then S3). No worker runs: a test that needs shards to
end plays the worker through db.jobs and db.transforms, as worker/ does.

Inputs are put in the fleet's store under the tenant (`tffleet://datasets/...`), or under a
`file://` directory the fleet allows. A refused transform leaves no row and publishes nothing."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api.transform_schemas import TransformCreate
from db import jobs, tenants, transforms
from db.models import Job, Transform, WebhookDelivery
from tests.api.conftest import Api, OpenApi, queued_messages
from tffleet import tensors
from tffleet.broker import queue_for
from tffleet.objectstore import ObjectStore

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]


def parquet(records: int, start: int = 0) -> bytes:
    """Records of `mlp`'s input: x (4 floats each) and an id column."""
    x = np.arange(start * 4, (start + records) * 4, dtype=np.float32).reshape(records, 4)
    table = pa.table(
        {
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4),
            "id": pa.array(np.arange(start, start + records)),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


@pytest.fixture
def allowed_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "allowed"
    directory.mkdir()
    return directory


@pytest.fixture
async def store_api(
    object_store: ObjectStore, open_api: OpenApi, allowed_dir: Path
) -> AsyncIterator[Api]:
    async with open_api(transform_locations=f"{allowed_dir.as_uri()}/") as running:
        yield running


def body(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": "mlp",
        "input": {"uri": "tffleet://datasets/set/", "columns": {"x": "features"}, "key": "id"},
        "output": {"format": "jsonl"},
        "shard_records": 10,
    }
    return spec | overrides


def counts(sessions: Sessions) -> tuple[int, int]:
    with sessions() as session:
        return (
            int(session.scalar(select(func.count()).select_from(Transform)) or 0),
            int(session.scalar(select(func.count()).select_from(Job)) or 0),
        )


def shards_of(sessions: Sessions, transform_id: str) -> list[Job]:
    with sessions() as session:
        query = select(Job).where(Job.transform_id == transform_id).order_by(Job.shard)
        found = list(session.scalars(query))
        for job in found:
            _ = job.inputs
        return found


def play_worker(sessions: Sessions, transform_id: str, bad: int = 0) -> None:
    """Claim every queued shard and end it as a worker does: complete with its counts and
    shard_finished in one transaction (`bad` records of each go to its errors file)."""
    ids = [job.id for job in shards_of(sessions, transform_id) if job.status == "queued"]
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=ids, owner="w1", lease_s=60)
    for lease in leases:
        ok = lease.samples - bad
        out = {"records": lease.samples, "succeeded": ok, "failed": bad}
        with sessions.begin() as session:
            packed = tensors.pack({k: np.int64(v) for k, v in out.items()})
            assert jobs.complete(session=session, results=[(lease, packed)])
            transforms.shard_finished(
                session, job_id=lease.job_id, transform_id=transform_id, succeeded=ok, failed=bad
            )


async def test_a_transform_is_stored_whole_with_a_queued_job_per_shard(
    store_api: Api, object_store: ObjectStore, broker: redis.Redis
) -> None:
    object_store.put("default/datasets/set/a.parquet", parquet(25))
    object_store.put("default/datasets/set/b.parquet", parquet(10, start=25))
    response = await store_api.client.post("/v1/transforms", json=body())
    assert response.status_code == 202, response.text
    out = response.json()
    transform_id = out["id"]
    assert out["status"] == "queued" and (out["model"], out["version"]) == ("mlp", 2)
    assert out["priority"] == -10  # below interactive jobs, by default
    assert out["counts"] == {"records": 35, "succeeded": 0, "failed": 0}
    assert out["shards"] == {"total": 4, "done": 0, "failed": 0, "running": 0}
    assert out["output"] == {
        "uri": f"tffleet://transforms/{transform_id}/",
        "format": "jsonl",
        "files": [],
    }
    assert out["errors_uri"] == f"tffleet://transforms/{transform_id}/errors/"
    assert out["progress"] == 0 and out["eta_s"] is None and out["finished_at"] is None
    shards = shards_of(store_api.sessions, transform_id)
    assert [job.samples for job in shards] == [10, 10, 5, 10]
    spec = transforms.shard_spec(shards[3].inputs)  # type: ignore[attr-defined]
    assert spec is not None and spec["file"]["uri"] == "tffleet://datasets/set/b.parquet"
    assert (spec["start"], spec["stop"], spec["columns"], spec["key"]) == (
        0,
        10,
        {"x": "features"},
        "id",
    )
    assert spec["file"]["info"]["records"] == 10 and spec["file"]["format"] == "parquet"
    assert spec["part_uri"] == f"tffleet://transforms/{transform_id}/part-00003.jsonl"
    (message,) = queued_messages(broker, queue_for("mlp"))
    assert message["body"] is not None  # one wake-up, after the commit, for every shard
    listed = (await store_api.client.get("/v1/jobs", params={"transform": transform_id})).json()
    assert sorted(j["id"] for j in listed["jobs"]) == sorted(j.id for j in shards)
    assert (await store_api.client.get("/v1/jobs")).json()["jobs"] == []  # not among jobs
    got = (await store_api.client.get(f"/v1/transforms/{transform_id}")).json()
    assert got["counts"] == out["counts"] and got["status"] == "queued"


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
@pytest.mark.parametrize(
    ("change", "status", "named"),
    [
        (
            {"input": {"uri": "tffleet://datasets/set/", "columns": {"x": "nope"}}},
            422,
            "input.columns.x",
        ),
        (
            {"input": {"uri": "tffleet://datasets/set/", "columns": {"x": "id"}}},
            422,
            "input.columns.x",
        ),
        (
            {"input": {"uri": "tffleet://datasets/set/", "columns": {"z": "id"}}},
            422,
            "input.columns.z",
        ),
        (
            {"input": {"uri": "tffleet://datasets/set/", "key": "k", "columns": {"x": "features"}}},
            422,
            "input.key",
        ),
        ({"input": {"uri": "https://example.com/a.parquet"}}, 422, "input.uri"),
        ({"input": {"uri": "file:///etc/passwd", "format": "csv"}}, 422, "input.uri"),
        ({"input": {"uri": "tffleet://datasets/none/"}}, 422, "input.uri"),
        ({"input": {"uri": "tffleet://datasets/set/", "format": "csv"}}, 422, "input.uri"),
        ({"output": {"uri": "http://example.com/out/"}}, 422, "output.uri"),
        ({"output": {"format": "csv"}}, 422, "output.format"),
        ({"priority": 11}, 422, "priority"),
        ({"shard_records": 1_000_000}, 422, "shard_records"),
        ({"shard_records": 0}, 422, "shard_records"),
        ({"model": "nope"}, 404, "nope"),
        ({"webhook": "http://127.0.0.1:1/hook"}, 422, "webhook"),
    ],
)
async def test_what_does_not_fit_is_refused_naming_the_field_and_nothing_is_stored(
    store_api: Api,
    object_store: ObjectStore,
    broker: redis.Redis,
    change: dict[str, Any],
    status: int,
    named: str,
) -> None:
    object_store.put("default/datasets/set/a.parquet", parquet(5))
    response = await store_api.client.post("/v1/transforms", json=body(**change))
    assert response.status_code == status, response.text
    assert named in response.json()["error"]["message"]
    assert counts(store_api.sessions) == (0, 0)
    assert queued_messages(broker, queue_for("mlp")) == []


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_files_under_an_allowed_directory_feed_the_model(
    store_api: Api, allowed_dir: Path
) -> None:
    rows = "".join(f"{i},{i},{i + 1},{i + 2},{i + 3}\n" for i in range(12))
    (allowed_dir / "in.csv").write_text("id,a,b,c,d\n" + rows)
    response = await store_api.client.post(
        "/v1/transforms",
        json={
            "model": "pair",
            "input": {"uri": f"{allowed_dir.as_uri()}/in.csv", "columns": {"a": "a", "b": "b"}},
            "output": {"uri": f"{allowed_dir.as_uri()}/out", "format": "parquet"},
        },
    )
    # `pair` takes a of 3 values and b of 2 per record: a CSV's columns are scalars.
    assert response.status_code == 422, response.text
    assert "input.columns.a" in response.json()["error"]["message"]
    lines = "".join(f'{{"id": {i}, "features": [{i}, 1, 2, 3]}}\n' for i in range(12))
    (allowed_dir / "in.jsonl").write_text(lines)
    response = await store_api.client.post(
        "/v1/transforms",
        json={
            "model": "mlp",
            "input": {"uri": f"{allowed_dir.as_uri()}/in.jsonl", "columns": {"x": "features"}},
            "output": {"uri": f"{allowed_dir.as_uri()}/out", "format": "parquet"},
            "shard_records": 5,
            "priority": 3,
        },
    )
    assert response.status_code == 202, response.text
    out = response.json()
    assert out["output"]["uri"] == f"{allowed_dir.as_uri()}/out/" and out["priority"] == 3
    assert out["shards"]["total"] == 3 and out["counts"]["records"] == 12


async def test_shards_that_end_are_counted_and_the_wait_returns_its_end(
    store_api: Api, object_store: ObjectStore
) -> None:
    object_store.put("default/datasets/set/a.parquet", parquet(20))
    hook = {"webhook": "https://93.184.216.34/t", "webhook_events": ["completed"]}
    created = await store_api.client.post("/v1/transforms", json=body(**hook))
    transform_id = created.json()["id"]
    play_worker(store_api.sessions, transform_id, bad=1)
    response = await store_api.client.get(f"/v1/transforms/{transform_id}", params={"wait": 5})
    out = response.json()
    assert out["status"] == "succeeded" and out["progress"] == 1.0
    assert out["counts"] == {"records": 20, "succeeded": 18, "failed": 2}
    assert out["shards"] == {"total": 2, "done": 2, "failed": 0, "running": 0}
    prefix = f"tffleet://transforms/{transform_id}/"
    assert out["output"]["files"] == [prefix + "part-00000.jsonl", prefix + "part-00001.jsonl"]
    with store_api.sessions() as session:
        delivery = session.scalars(select(WebhookDelivery)).one()
    assert (delivery.job_id, delivery.event, delivery.url) == (
        transform_id,
        "transform",
        "https://93.184.216.34/t",
    )
    shard = (await store_api.client.get("/v1/jobs", params={"transform": transform_id})).json()
    assert {j["status"] for j in shard["jobs"]} == {"succeeded"}
    assert shard["jobs"][0]["outputs"] is None  # a listing shows no outputs; GET one does
    one = (await store_api.client.get(f"/v1/jobs/{shard['jobs'][0]['id']}")).json()
    assert one["outputs"]["records"] == 10 and one["outputs"]["failed"] == 1


async def test_events_stream_its_progress_until_it_ends(
    store_api: Api, object_store: ObjectStore
) -> None:
    object_store.put("default/datasets/set/a.parquet", parquet(10))
    transform_id = (await store_api.client.post("/v1/transforms", json=body())).json()["id"]
    play_worker(store_api.sessions, transform_id)
    url = f"/v1/transforms/{transform_id}/events"
    async with store_api.client.stream("GET", url) as response:
        assert response.status_code == 200
        text = "".join([chunk async for chunk in response.aiter_text()])
    assert "event: progress" in text and '"status":"succeeded"' in text
    last = [line for line in text.splitlines() if line.startswith("id: ")][-1][4:]
    assert last == "succeeded.1.0.10"
    again = await store_api.client.get(url, headers={"Last-Event-ID": last})
    assert again.status_code == 204


async def test_cancel_then_retry_runs_only_the_shards_not_done(
    store_api: Api, object_store: ObjectStore, broker: redis.Redis
) -> None:
    object_store.put("default/datasets/set/a.parquet", parquet(30))
    transform_id = (await store_api.client.post("/v1/transforms", json=body())).json()["id"]
    first = shards_of(store_api.sessions, transform_id)[0]
    with store_api.sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[first.id], owner="w1", lease_s=60)
        jobs.complete(session=session, results=[(lease, b"")])
        transforms.shard_finished(
            session, job_id=first.id, transform_id=transform_id, succeeded=10, failed=0
        )
    broker.flushdb()
    canceled = await store_api.client.post(f"/v1/transforms/{transform_id}/cancel")
    assert canceled.status_code == 200, canceled.text
    assert canceled.json()["status"] == "canceled"
    assert canceled.json()["shards"]["done"] == 1
    assert (await store_api.client.post(f"/v1/transforms/{transform_id}/cancel")).status_code == 200
    retried = await store_api.client.post(f"/v1/transforms/{transform_id}/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "running" and retried.json()["finished_at"] is None
    statuses = [job.status for job in shards_of(store_api.sessions, transform_id)]
    assert statuses == ["succeeded", "queued", "queued"]
    (message,) = queued_messages(broker, queue_for("mlp"))
    assert message is not None
    again = await store_api.client.post(f"/v1/transforms/{transform_id}/retry")
    assert again.status_code == 409


async def test_a_transform_is_its_tenants(store_api: Api, object_store: ObjectStore) -> None:
    object_store.put("acme/datasets/set/a.parquet", parquet(5))
    acme = store_api.key("acme")
    mine = await store_api.client.post("/v1/transforms", json=body(), headers=acme)
    assert mine.status_code == 202, mine.text
    transform_id = mine.json()["id"]
    other = store_api.key("other")
    for method, path in [
        ("GET", f"/v1/transforms/{transform_id}"),
        ("POST", f"/v1/transforms/{transform_id}/cancel"),
        ("POST", f"/v1/transforms/{transform_id}/retry"),
        ("GET", f"/v1/transforms/{transform_id}/events"),
    ]:
        response = await store_api.client.request(method, path, headers=other)
        assert response.status_code == 404, (path, response.text)
    assert (await store_api.client.get("/v1/transforms", headers=other)).json() == {
        "transforms": [],
        "next_cursor": None,
    }
    listed = (await store_api.client.get("/v1/transforms", headers=acme)).json()
    assert [t["id"] for t in listed["transforms"]] == [transform_id]
    # The default tenant has no such dataset: a tffleet:// URI is always the caller's tenant's.
    missing = await store_api.client.post("/v1/transforms", json=body(), headers=store_api.key("x"))
    assert missing.status_code == 422 and "input.uri" in missing.text


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_its_shards_count_against_the_tenants_quota(
    store_api: Api, object_store: ObjectStore
) -> None:
    with store_api.sessions.begin() as session:
        tenants.ensure_tenant(session=session, name="small")
        tenants.set_limits(session=session, name="small", max_queued_jobs=3)
    object_store.put("small/datasets/set/a.parquet", parquet(40))
    response = await store_api.client.post(
        "/v1/transforms", json=body(), headers=store_api.key("small")
    )
    assert response.status_code == 429, response.text
    assert counts(store_api.sessions) == (0, 0)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_the_console_lists_the_latest_transforms_with_their_progress(
    store_api: Api, object_store: ObjectStore
) -> None:
    object_store.put("acme/datasets/set/a.parquet", parquet(20))
    created = await store_api.client.post(
        "/v1/transforms", json=body(), headers=store_api.key("acme")
    )
    transform_id = created.json()["id"]
    first = shards_of(store_api.sessions, transform_id)[0]
    with store_api.sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[first.id], owner="w1", lease_s=60)
        jobs.progress(session=session, lease=lease, samples_done=4, lease_s=60)
    overview = (await store_api.client.get("/v1/console/overview")).json()
    (shown,) = overview["transforms"]
    assert (shown["id"], shown["tenant"], shown["status"]) == (transform_id, "acme", "running")
    assert shown["progress"] == 0.2 and shown["shards"]["running"] == 1
    assert shown["started_at"] is not None


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_an_idempotency_key_sent_again_gets_the_transform_it_stored(
    store_api: Api, object_store: ObjectStore, broker: redis.Redis
) -> None:
    object_store.put("default/datasets/set/a.parquet", parquet(25))
    keyed = {"Idempotency-Key": "transform-1"}
    first = await store_api.client.post("/v1/transforms", json=body(), headers=keyed)
    assert first.status_code == 202, first.text
    assert first.headers["Idempotent-Replayed"] == "false"
    transform_id = first.json()["id"]
    assert counts(store_api.sessions) == (1, 3)
    play_worker(store_api.sessions, transform_id)
    # The answer was lost; the client sends it again (its keys in another order): the same
    # transform as it is now, nothing stored or published again.
    again = {"shard_records": 10, **body()}
    replay = await store_api.client.post("/v1/transforms", json=again, headers=keyed)
    assert replay.status_code == 202, replay.text
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == transform_id and replay.json()["status"] == "succeeded"
    assert counts(store_api.sessions) == (1, 3)
    assert len(queued_messages(broker, queue_for("mlp"))) <= 3
    # The same key with another request: 409, nothing stored.
    other = await store_api.client.post("/v1/transforms", json=body(shard_records=5), headers=keyed)
    assert other.status_code == 409, other.text
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert "Idempotency-Key 'transform-1'" in other.json()["error"]["message"]
    assert counts(store_api.sessions) == (1, 3)
    # A key is no key at all: 400 naming the header; without a key, a second transform.
    bad = await store_api.client.post(
        "/v1/transforms", json=body(), headers={"Idempotency-Key": "a b"}
    )
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]["message"]
    plain = await store_api.client.post("/v1/transforms", json=body())
    assert plain.status_code == 202 and "Idempotent-Replayed" not in plain.headers
    assert plain.json()["id"] != transform_id and counts(store_api.sessions) == (2, 6)


def test_batch_records_is_said_to_be_records_read_at_a_time_not_a_forward_pass() -> None:
    # The worker reads `batch_records` at a time and runs the model in chunks of at most its
    # `max_batch_size` (worker/transform.py): the reference must not promise larger passes.
    field = TransformCreate.model_json_schema()["properties"]["batch_records"]
    assert "at most the model's `max_batch_size`" in field["description"]
    assert "per forward pass" not in field["description"].lower()
