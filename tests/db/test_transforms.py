"""A transform's rows: its shards are jobs, and every way a shard ends counts into it once
(db/transforms.py, db/transform_control.py). On SQLite and PostgreSQL (tests/db/conftest.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, tenants, transform_control, transforms, webhooks
from db.models import DEFAULT_TENANT, Job, JobErrorCode, JobStatus, WebhookDelivery
from db.transform_views import transform_out
from tffleet import tensors
from tffleet.errors import Conflict, IdempotencyKeyReused, NotFound

Sessions = sessionmaker[Session]


def new_transform(
    records: list[int], shard_records: int = 10, tenant: str = DEFAULT_TENANT, **kwargs: Any
) -> transform_control.NewTransform:
    files = [
        {"uri": f"tffleet://datasets/f{i}.parquet", "format": "parquet", "info": {"records": n}}
        for i, n in enumerate(records)
    ]
    fields: dict[str, Any] = {
        "tenant": tenant,
        "model": "m",
        "version": 1,
        "priority": -10,
        "spec": {
            "input": {"uri": "tffleet://datasets/", "format": "parquet", "columns": None},
            "output": {"uri": "tffleet://transforms/t/", "format": "jsonl"},
            "shard_records": shard_records,
        },
        "files": files,
        "output_uri": "file:///srv/out",
        "errors_uri": "file:///srv/out/errors/",
        "shard_records": shard_records,
        "batch_records": 4,
    }
    return transform_control.NewTransform(**(fields | kwargs))


def create(sessions: Sessions, new: transform_control.NewTransform) -> tuple[str, list[str]]:
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=new.tenant)
        transform, shard_ids = transform_control.create(session=session, new=new)
        return transform.id, shard_ids


def claim(sessions: Sessions, job_ids: list[str]) -> list[jobs.Lease]:
    with sessions.begin() as session:
        return jobs.claim(session=session, job_ids=job_ids, owner="w1", lease_s=60)


def finish(sessions: Sessions, lease: jobs.Lease, transform_id: str, ok: int, bad: int) -> bool:
    """What the worker's completing transaction does: `complete`, then `shard_finished`."""
    counts = {name: np.int64(n) for name, n in [("succeeded", ok), ("failed", bad)]}
    with sessions.begin() as session:
        written = jobs.complete(session=session, results=[(lease, tensors.pack(counts))])
        ended = transforms.shard_finished(
            session, job_id=lease.job_id, transform_id=transform_id, succeeded=ok, failed=bad
        )
        return bool(written) and ended


def view(sessions: Sessions, transform_id: str) -> dict[str, Any]:
    with sessions() as session:
        transform = transform_control.get(session=session, transform_id=transform_id)
        running = transform_control.running(session=session, transform=transform)
        return transform_out(transform, running=running)


def test_a_shard_spec_round_trips_and_packed_tensors_are_none() -> None:
    spec = {"transform": "t", "shard": 3, "start": 0, "stop": 10}
    blob = transforms.pack_shard_spec(spec)
    assert blob.startswith(b"TFS1") and transforms.shard_spec(blob) == spec
    assert transforms.shard_spec(memoryview(blob)) == spec
    packed = tensors.pack({"x": np.zeros(3, dtype="float32")})
    assert transforms.shard_spec(packed) is None and transforms.shard_spec(None) is None


def test_shards_never_span_two_files_and_keep_input_order() -> None:
    plan = transform_control.plan_shards([25, 0, 10], 10)
    assert [(s.file, s.start, s.stop) for s in plan] == [
        (0, 0, 10),
        (0, 10, 20),
        (0, 20, 25),
        (2, 0, 10),
    ]
    with pytest.raises(ValueError, match="shard_records"):
        transform_control.plan_shards([1], 0)


def test_create_stores_the_transform_and_a_queued_job_per_shard(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([25, 10]))
    with sessions() as session:
        rows = session.scalars(
            select(Job).where(Job.transform_id == transform_id).order_by(Job.shard)
        ).all()
        specs = [transforms.shard_spec(job.inputs) for job in rows]  # type: ignore[attr-defined]
    assert [row.id for row in rows] == shard_ids
    assert [row.samples for row in rows] == [10, 10, 5, 10]
    assert {(row.status, row.priority, row.model, row.version) for row in rows} == {
        ("queued", -10, "m", 1)
    }
    assert [(s["shard"], s["start"], s["stop"]) for s in specs if s] == [
        (0, 0, 10),
        (1, 10, 20),
        (2, 20, 25),
        (3, 0, 10),
    ]
    last = specs[3]
    assert last is not None and last["file"]["uri"] == "tffleet://datasets/f1.parquet"
    assert last["part_uri"] == "file:///srv/out/part-00003.jsonl"
    assert last["errors_uri"] == "file:///srv/out/errors/part-00003.jsonl"
    assert last["batch_records"] == 4 and last["output"]["format"] == "jsonl"
    out = view(sessions, transform_id)
    assert out["status"] == "queued" and out["counts"] == {
        "records": 35,
        "succeeded": 0,
        "failed": 0,
    }
    assert out["shards"] == {"total": 4, "done": 0, "failed": 0, "running": 0}
    assert out["progress"] == 0 and out["output"]["files"] == []


def test_shards_that_finish_add_their_counts_and_the_last_ends_it(sessions: Sessions) -> None:
    events = int(webhooks.Event.COMPLETED)
    new = new_transform([20], webhook="https://h.example/", webhook_events=events)
    transform_id, shard_ids = create(sessions, new)
    first, second = claim(sessions, shard_ids)
    assert view(sessions, transform_id)["status"] == "running"
    assert not finish(sessions, first, transform_id, 9, 1)
    out = view(sessions, transform_id)
    assert out["status"] == "running" and out["shards"]["done"] == 1
    assert out["counts"] == {"records": 20, "succeeded": 9, "failed": 1}
    assert out["output"]["files"] == ["file:///srv/out/part-00000.jsonl"]
    assert out["progress"] == 0.5 and out["started_at"] is not None
    assert finish(sessions, second, transform_id, 10, 0)
    out = view(sessions, transform_id)
    assert out["status"] == "succeeded" and out["finished_at"] is not None
    assert out["counts"]["succeeded"] == 19 and out["progress"] == 1.0 and out["eta_s"] is None
    with sessions() as session:
        delivery = session.scalars(select(WebhookDelivery)).one()
    assert (delivery.job_id, delivery.event) == (transform_id, webhooks.TRANSFORM_EVENT)
    assert delivery.job_status == "succeeded"


def test_a_one_shard_transform_starts_at_its_shards_claim_and_never_after_it_ends(
    sessions: Sessions,
) -> None:
    transform_id, shard_ids = create(sessions, new_transform([5]))
    (lease,) = claim(sessions, shard_ids)
    assert finish(sessions, lease, transform_id, 5, 0)
    with sessions() as session:
        transform = transform_control.get(session=session, transform_id=transform_id)
        shard = session.get(Job, shard_ids[0])
        assert shard is not None and shard.started_at is not None
        assert transform.started_at is not None and transform.finished_at is not None
        assert transform.started_at == shard.started_at
        assert transform.started_at <= transform.finished_at


def test_a_keyed_transform_is_stored_once_and_its_key_bound_to_its_request(
    sessions: Sessions,
) -> None:
    # Two requests under one key that both passed the API's look-up (a race): the second
    # stores nothing and gets the first's transform; another request's hash is refused.
    keyed = {"idempotency_key": "k1", "request_hash": "a" * 64}
    first_id, shard_ids = create(sessions, new_transform([20], id="t-first", **keyed))
    again_id, again_shards = create(sessions, new_transform([20], id="t-again", **keyed))
    assert (first_id, len(shard_ids)) == ("t-first", 2)
    assert (again_id, again_shards) == ("t-first", [])
    with pytest.raises(IdempotencyKeyReused, match="Idempotency-Key 'k1'"):
        create(sessions, new_transform([20], id="t-other", idempotency_key="k1",
                                       request_hash="b" * 64))  # fmt: skip
    other_tenant, _ = create(sessions, new_transform([20], id="t-acme", tenant="acme", **keyed))
    assert other_tenant == "t-acme", "keys are per tenant"
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 4


def test_a_late_or_foreign_result_counts_nothing(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([10]))
    other_id, _ = create(sessions, new_transform([10]))
    (lease,) = claim(sessions, shard_ids)
    with sessions.begin() as session:  # not succeeded: its complete did not match
        assert not transforms.shard_finished(
            session, job_id=lease.job_id, transform_id=transform_id, succeeded=10, failed=0
        )
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, b"")])
        assert not transforms.shard_finished(
            session, job_id=lease.job_id, transform_id=other_id, succeeded=10, failed=0
        )
    assert view(sessions, transform_id)["shards"]["done"] == 0
    assert view(sessions, other_id)["shards"]["done"] == 0


def test_a_shard_failed_for_good_fails_it_and_retry_runs_only_that_one(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([20]))
    first, second = claim(sessions, shard_ids)
    finish(sessions, first, transform_id, 10, 0)
    with sessions.begin() as session:
        jobs.fail(session=session, leases=[second], code=JobErrorCode.MODEL_ERROR, message="x")
    out = view(sessions, transform_id)
    assert out["status"] == "failed" and out["shards"] == {
        "total": 2,
        "done": 1,
        "failed": 1,
        "running": 0,
    }
    with sessions.begin() as session:
        transform, retried = transform_control.retry(session=session, transform_id=transform_id)
    assert retried == [second.job_id] and transform.status == "running"
    assert transform.shards_failed == 0 and transform.finished_at is None
    with sessions() as session:
        statuses = [jobs.get(session=session, job_id=i).status for i in shard_ids]
    assert statuses == [JobStatus.SUCCEEDED, JobStatus.QUEUED]
    (again,) = claim(sessions, [second.job_id])
    assert finish(sessions, again, transform_id, 10, 0)
    assert view(sessions, transform_id)["status"] == "succeeded"
    with sessions.begin() as session, pytest.raises(Conflict):
        transform_control.retry(session=session, transform_id=transform_id)


def test_a_worker_lost_or_a_canceled_shard_counts_as_failed(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([20]))
    (lost,) = claim(sessions, shard_ids[:1])
    with sessions.begin() as session:
        taken = jobs.take_back_from(session=session, owner_prefix="w1", max_attempts=1)
    assert taken.failed == [lost.job_id]
    assert view(sessions, transform_id)["shards"]["failed"] == 1
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=shard_ids[1])
    out = view(sessions, transform_id)
    assert out["status"] == "failed" and out["shards"]["failed"] == 2


def test_cancel_stops_queued_and_running_shards_and_fences_late_results(
    sessions: Sessions,
) -> None:
    transform_id, shard_ids = create(sessions, new_transform([30]))
    running, _ = claim(sessions, shard_ids[:2])
    with sessions.begin() as session:
        canceled = transform_control.cancel(session=session, transform_id=transform_id)
    assert canceled.status == "canceled" and canceled.finished_at is not None
    with sessions() as session:
        statuses = {jobs.get(session=session, job_id=i).status for i in shard_ids}
    assert statuses == {JobStatus.CANCELED}
    assert not finish(sessions, running, transform_id, 10, 0)
    out = view(sessions, transform_id)
    assert out["shards"]["done"] == 0 and out["status"] == "canceled"
    with sessions.begin() as session:  # twice: no error
        transform_control.cancel(session=session, transform_id=transform_id)
    with sessions.begin() as session:
        transform, retried = transform_control.retry(session=session, transform_id=transform_id)
    assert retried == shard_ids and transform.status == "queued"
    assert transform.shards_failed == 0


def test_cancel_of_a_succeeded_transform_is_a_conflict(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([5]))
    (lease,) = claim(sessions, shard_ids)
    finish(sessions, lease, transform_id, 5, 0)
    with sessions.begin() as session, pytest.raises(Conflict, match="succeeded"):
        transform_control.cancel(session=session, transform_id=transform_id)


def test_an_empty_input_ends_at_once(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([0]))
    assert shard_ids == [] and view(sessions, transform_id)["status"] == "succeeded"


def test_transforms_are_their_tenants_and_list_newest_first(sessions: Sessions) -> None:
    mine = [create(sessions, new_transform([1], tenant="a"))[0] for _ in range(3)]
    theirs, _ = create(sessions, new_transform([1], tenant="b"))
    with sessions() as session:
        with pytest.raises(NotFound):
            transform_control.get(session=session, transform_id=theirs, tenant="a")
        page, cursor = transform_control.list_transforms(session=session, tenant="a", limit=2)
        assert [t.id for t in page] == mine[::-1][:2] and cursor == mine[1]
        rest, end = transform_control.list_transforms(
            session=session, tenant="a", limit=2, cursor=cursor
        )
        assert [t.id for t in rest] == mine[:1] and end is None


def test_a_shard_of_no_good_record_is_no_file_of_its_output(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([20]))
    first, second = claim(sessions, shard_ids)
    finish(sessions, first, transform_id, 0, 10)  # every record bad: its worker wrote no part
    assert finish(sessions, second, transform_id, 10, 0)
    out = view(sessions, transform_id)
    assert out["status"] == "succeeded" and out["counts"]["failed"] == 10
    assert out["output"]["files"] == ["file:///srv/out/part-00001.jsonl"]


def test_of_shards_ending_at_once_exactly_one_ends_the_transform(sessions: Sessions) -> None:
    transform_id, shard_ids = create(sessions, new_transform([40]))
    leases = claim(sessions, shard_ids)
    barrier = threading.Barrier(len(leases))
    ended: list[bool] = []

    def end(lease: jobs.Lease) -> None:
        barrier.wait()
        ended.append(finish(sessions, lease, transform_id, 10, 0))

    threads = [threading.Thread(target=end, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(ended) == [False, False, False, True]
    out = view(sessions, transform_id)
    assert out["status"] == "succeeded" and out["counts"]["succeeded"] == 40
    assert out["shards"]["done"] == 4
