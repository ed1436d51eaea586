"""A transform's shard run by a child (worker/transform.py): read ahead, run, its part written
whole, its counts counted into its transform; bad records to the errors file; stopped at a batch
boundary by a cancel or a drain, leaving no part.

Over a fake model of small images, on SQLite (the counting transaction on PostgreSQL too), with
a real store: a directory and the run's SeaweedFS in turn. The transform and its shard jobs are
made here as the API makes them (one row, jobs whose inputs are shard specs).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, tenants, transforms
from db.models import DEFAULT_TENANT, Job, JobStatus, Transform
from tests.datasets.files import images, npy, parquet
from tests.worker.test_batching import outputs_of, policy, read
from tests.worker.test_objects import dead_store
from tffleet import tensors
from tffleet.datasets import formats
from tffleet.datasets.locations import resolve
from tffleet.objectstore import StoreUnavailable
from tffleet.settings import Settings
from worker import transform
from worker.batching import Batcher, BatchReport
from worker.drain import Drain

Sessions = sessionmaker[Session]
SHAPE = (4, 4, 3)
POISON = 13.0  # the model raises on a record holding it (record 13 of `images`)


class ImageRunner:
    """y = [sum, max] of an image; raises on POISON; `during` is called before pass `at`."""

    inputs = {"image": {"dtype": "float32", "shape": [-1, *SHAPE]}}

    def __init__(self, during: Callable[[], None] | None = None, at: int = 1) -> None:
        self.sizes: list[int] = []
        self._during, self._at = during, at

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = batch["image"]
        self.sizes.append(len(x))
        if self._during is not None and len(self.sizes) == self._at:
            self._during()
        if (x == POISON).any():
            raise ValueError("poisoned input")
        return {"y": model(x)}


def model(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(len(x), -1)
    return np.stack([flat.sum(axis=1), flat.max(axis=1)], axis=1).astype(np.float32)


@pytest.fixture
def settings(object_store_url: str) -> Settings:
    return Settings(object_store=object_store_url)


def put(settings: Settings, path: str, data: bytes) -> str:
    uri = f"tffleet://datasets/{path}"
    location = resolve(uri, DEFAULT_TENANT, settings)
    location.store.put(location.key, data)
    return uri


def table(records: int, *, null: Sequence[int] = (), nan: Sequence[int] = ()) -> bytes:
    pixels = images(records, SHAPE).reshape(records, -1)
    for i in nan:
        pixels[i, 1] = np.nan
    mask = np.zeros(records, dtype=bool)
    mask[list(null)] = True
    values = pa.FixedSizeListArray.from_arrays(
        pa.array(pixels.ravel()), pixels.shape[1], mask=pa.array(mask)
    )
    ids = pa.array([f"r{i}" for i in range(records)])
    return parquet(pa.table({"id": ids, "pixels": values}), row_group_size=16)


def make_transform(
    sessions: Sessions,
    settings: Settings,
    uri: str,
    *,
    format: str,
    output: str = "parquet",
    shard_records: int,
    columns: dict[str, str] | None = None,
    key: str | None = None,
    edit: Callable[[dict[str, Any]], None] = lambda spec: None,
) -> tuple[str, list[str]]:
    """A transform of the file at `uri` and its shard jobs (as the API stores them)."""
    info = formats.inspect(resolve(uri, DEFAULT_TENANT, settings), format)
    transform_id = f"00000000-0000-7000-8000-{datetime.now(UTC).strftime('%H%M%S%f')}"
    out = f"tffleet://transforms/{transform_id}"
    starts = list(range(0, info.records, shard_records))
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=DEFAULT_TENANT)
        session.add(
            Transform(
                id=transform_id, tenant=DEFAULT_TENANT, model="m", version=1,
                status="queued", priority=0, spec={}, files=[], output_uri=out,
                errors_uri=f"{out}/errors", records=info.records, records_succeeded=0,
                records_failed=0, shards_total=len(starts), shards_done=0, shards_failed=0,
                created_at=datetime.now(UTC),
            )
        )  # fmt: skip
        session.flush()
        new = []
        for shard, start in enumerate(starts):
            stop = min(info.records, start + shard_records)
            spec = {
                "transform": transform_id, "shard": shard,
                "file": {"uri": uri, "format": format, "info": info.to_json()},
                "start": start, "stop": stop, "columns": columns or {}, "key": key,
                "output": {"uri": out, "format": output},
                "part_uri": f"{out}/part-{shard:05d}.{output}",
                "errors_uri": f"{out}/errors/part-{shard:05d}.jsonl", "batch_records": 8,
            }  # fmt: skip
            edit(spec)
            new.append(
                jobs.NewJob(
                    model="m",
                    version=1,
                    samples=stop - start,
                    inputs=transforms.pack_shard_spec(spec),
                )
            )
        ids = [row.id for row in jobs.create(session=session, jobs=new)]
        for shard, job_id in enumerate(ids):
            session.execute(
                update(Job).where(Job.id == job_id).values(transform_id=transform_id, shard=shard)
            )
    return transform_id, ids


def batcher(
    sessions: Sessions, settings: Settings, *, draining: Callable[[], bool] | None = None
) -> Batcher:
    return Batcher(
        sessions=sessions, owner="t1", lease_s=30, notify=lambda ended: None,
        settings=settings, draining=draining or (lambda: False),
        peers=lambda model, version: 1,  # a job larger than a batch would be split; a shard never
    )  # fmt: skip


def run(b: Batcher, job_ids: Sequence[str], runner: Any, max_batch_size: int = 4) -> BatchReport:
    return b.run(
        model="m", version=1, job_ids=job_ids, runner=runner,
        policy=policy(max_batch_size=max_batch_size, buckets=(1, 2, 4)),
    )  # fmt: skip


def fetch(settings: Settings, uri: str) -> bytes | None:
    location = resolve(uri, DEFAULT_TENANT, settings)
    if location.store.size(location.key) is None:
        return None
    return bytes(location.store.get(location.key))


def the_transform(sessions: Sessions, transform_id: str) -> Transform:
    with sessions() as session:
        row = session.get(Transform, transform_id)
        assert row is not None
        return row


@pytest.mark.both_databases
def test_a_parquet_shard_writes_its_part_in_order_with_keys_and_its_bad_records_apart(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.parquet", table(40, null=[5], nan=[7]))
    transform_id, ids = make_transform(
        sessions, settings, uri, format="parquet", shard_records=20,
        columns={"image": "pixels"}, key="id",
    )  # fmt: skip
    runner = ImageRunner()
    b = batcher(sessions, settings)
    for job_id in ids:  # a shard of 20 records is larger than a batch: each runs alone
        run(b, [job_id], runner)

    x = images(40, SHAPE)
    good = [i for i in range(40) if i not in (5, 7, 13)]
    parts = [fetch(settings, f"tffleet://transforms/{transform_id}/part-{k:05d}.parquet")
             for k in (0, 1)]  # fmt: skip
    got = pa.concat_tables([pq.read_table(io.BytesIO(p)) for p in parts if p is not None])
    assert got.column_names == ["id", "y"]
    assert got.column("id").to_pylist() == [f"r{i}" for i in good]
    np.testing.assert_allclose(np.array(got.column("y").to_pylist()), model(x[good]), rtol=1e-6)
    assert max(runner.sizes) <= 4, "the model runs at its max_batch_size"

    errors = fetch(settings, f"tffleet://transforms/{transform_id}/errors/part-00000.jsonl")
    assert errors is not None
    lines = [orjson.loads(line) for line in errors.splitlines()]
    assert [(e["index"], e["key"]) for e in lines] == [(5, None), (7, "r7"), (13, "r13")]
    assert "null" in lines[0]["reason"] and "NaN" in lines[1]["reason"]
    assert "poisoned input" in lines[2]["reason"]
    assert fetch(settings, f"tffleet://transforms/{transform_id}/errors/part-00001.jsonl") is None

    first = outputs_of(sessions, ids[0])
    assert {k: int(v) for k, v in first.items()} == {"records": 20, "succeeded": 17, "failed": 3}
    row = the_transform(sessions, transform_id)
    assert (row.status, row.shards_done, row.records_succeeded, row.records_failed) == (
        "succeeded", 2, 37, 3,
    )  # fmt: skip


def test_an_npy_shard_writes_an_npy_part_of_its_outputs(
    sessions: Sessions, settings: Settings
) -> None:
    x = images(10, SHAPE)
    uri = put(settings, "in.npy", npy(x))
    transform_id, (job_id,) = make_transform(
        sessions, settings, uri, format="npy", output="npy", shard_records=10
    )
    run(batcher(sessions, settings), [job_id], ImageRunner())

    part = fetch(settings, f"tffleet://transforms/{transform_id}/part-00000.npy")
    assert part is not None
    np.testing.assert_allclose(np.load(io.BytesIO(part)), model(x), rtol=1e-6)
    assert read(sessions, job_id).status == JobStatus.SUCCEEDED
    assert the_transform(sessions, transform_id).status == "succeeded"


def test_a_small_shard_claimed_beside_other_jobs_runs_alone_and_they_run_as_ever(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(images(3, SHAPE)))
    transform_id, (shard,) = make_transform(
        sessions, settings, uri, format="npy", output="parquet", shard_records=3
    )
    x = images(1, SHAPE) + 100
    with sessions.begin() as session:
        (plain,) = jobs.create(
            session=session,
            jobs=[jobs.NewJob(model="m", version=1, samples=1, inputs=tensors.pack({"image": x}))],
        )
    runner = ImageRunner()
    report = run(batcher(sessions, settings), [plain.id, shard], runner, max_batch_size=8)

    np.testing.assert_allclose(outputs_of(sessions, plain.id)["y"], model(x), rtol=1e-6)
    assert read(sessions, shard).status == JobStatus.SUCCEEDED
    assert report.succeeded == 2
    assert sorted(runner.sizes) == [1, 4], "each in forward passes of its own"
    assert fetch(settings, f"tffleet://transforms/{transform_id}/part-00000.parquet")


def test_a_canceled_shard_stops_at_a_batch_boundary_and_leaves_no_part(
    sessions: Sessions, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transform, "PROGRESS_EVERY_S", 0.0)
    uri = put(settings, "in.npy", npy(images(40, SHAPE)))
    transform_id, (job_id,) = make_transform(
        sessions, settings, uri, format="npy", output="parquet", shard_records=40
    )

    def cancel() -> None:
        with sessions.begin() as session:
            jobs.cancel(session=session, job_id=job_id)

    runner = ImageRunner(during=cancel, at=2)
    report = run(batcher(sessions, settings), [job_id], runner)

    assert read(sessions, job_id).status == JobStatus.CANCELED
    assert len(runner.sizes) < 10, "it stopped before the shard's end"
    assert report.succeeded == 0
    assert fetch(settings, f"tffleet://transforms/{transform_id}/part-00000.parquet") is None


def test_a_draining_worker_puts_a_running_shard_back_unstarted(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(images(40, SHAPE)))
    transform_id, (job_id,) = make_transform(
        sessions, settings, uri, format="npy", output="parquet", shard_records=40
    )
    drain = Drain()
    runner = ImageRunner(during=drain.begin, at=2)
    run(batcher(sessions, settings, draining=drain.began), [job_id], runner)

    job = read(sessions, job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    assert fetch(settings, f"tffleet://transforms/{transform_id}/part-00000.parquet") is None

    # Run again later, whole.
    run(batcher(sessions, settings), [job_id], ImageRunner())
    assert read(sessions, job_id).status == JobStatus.SUCCEEDED
    row = the_transform(sessions, transform_id)
    assert (row.records_succeeded, row.records_failed) == (39, 1)  # record 13 is POISON


def test_a_shard_whose_file_is_gone_fails_input_missing(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(images(4, SHAPE)))
    transform_id, (job_id,) = make_transform(sessions, settings, uri, format="npy", shard_records=4)
    location = resolve(uri, DEFAULT_TENANT, settings)
    location.store.delete([location.key])
    run(batcher(sessions, settings), [job_id], ImageRunner())

    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "input_missing")
    assert job.error_message is not None and uri in job.error_message
    row = the_transform(sessions, transform_id)
    assert (row.status, row.shards_failed) == ("failed", 1)


def test_a_model_that_fails_every_record_fails_the_shard_model_error(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(np.full((3, *SHAPE), POISON, dtype=np.float32)))
    _, (job_id,) = make_transform(sessions, settings, uri, format="npy", shard_records=3)
    run(batcher(sessions, settings), [job_id], ImageRunner())

    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "model_error")
    assert job.error_message is not None and "poisoned input" in job.error_message


def test_a_shard_that_names_a_location_the_worker_refuses_fails_invalid_input(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.npy", npy(images(2, SHAPE)))
    _, (job_id,) = make_transform(
        sessions, settings, uri, format="npy", shard_records=2,
        edit=lambda spec: spec.update(part_uri="file:///etc/part.parquet"),
    )  # fmt: skip
    run(batcher(sessions, settings), [job_id], ImageRunner())

    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "invalid_input")
    assert job.error_message is not None and "file:///etc/part.parquet" in job.error_message


def test_a_store_that_does_not_take_the_part_puts_the_shard_back_with_no_attempt_spent(
    sessions: Sessions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "in.npy").write_bytes(npy(images(4, SHAPE)))
    dead_store(monkeypatch)  # the fleet's own store, where the part goes, answers nothing
    settings = Settings(
        object_store="s3://tffleet-test/x", transform_locations=f"{allowed.as_uri()}/"
    )
    transform_id, (job_id,) = make_transform(
        sessions, settings, f"{allowed.as_uri()}/in.npy", format="npy", shard_records=4
    )
    with pytest.raises(StoreUnavailable):
        run(batcher(sessions, settings), [job_id], ImageRunner())

    job = read(sessions, job_id)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    row = the_transform(sessions, transform_id)
    assert (row.status, row.shards_done, row.shards_failed) == ("queued", 0, 0)


def test_a_json_lines_shard_writes_json_lines_with_its_keys_and_a_short_record_apart(
    sessions: Sessions, settings: Settings
) -> None:
    x = images(5, SHAPE).reshape(5, -1)
    lines = [{"name": f"n{i}", "pixels": x[i].tolist()} for i in range(5)]
    lines[2]["pixels"] = lines[2]["pixels"][:10]
    uri = put(settings, "in.jsonl", b"".join(orjson.dumps(line) + b"\n" for line in lines))
    transform_id, (job_id,) = make_transform(
        sessions, settings, uri, format="jsonl", output="jsonl", shard_records=5,
        columns={"image": "pixels"}, key="name",
    )  # fmt: skip
    run(batcher(sessions, settings), [job_id], ImageRunner())

    part = fetch(settings, f"tffleet://transforms/{transform_id}/part-00000.jsonl")
    assert part is not None
    rows = [orjson.loads(line) for line in part.splitlines()]
    assert [row["name"] for row in rows] == ["n0", "n1", "n3", "n4"]
    good = images(5, SHAPE)[[0, 1, 3, 4]]
    np.testing.assert_allclose(np.array([row["y"] for row in rows]), model(good), rtol=1e-5)
    errors = fetch(settings, f"tffleet://transforms/{transform_id}/errors/part-00000.jsonl")
    assert errors is not None
    (error,) = [orjson.loads(line) for line in errors.splitlines()]
    assert (error["index"], error["key"]) == (2, "n2") and "10 values" in error["reason"]


def test_a_key_that_shares_an_output_name_fails_the_shard_before_it_reads(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.parquet", table(4))
    _, (job_id,) = make_transform(
        sessions, settings, uri, format="parquet", shard_records=4, columns={"image": "pixels"},
        key="id",
    )  # fmt: skip
    runner = ImageRunner()
    runner.outputs = {"id": {"dtype": "float32", "shape": [-1, 2]}}  # type: ignore[attr-defined]
    run(batcher(sessions, settings), [job_id], runner)

    job = read(sessions, job_id)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "invalid_input")
    assert runner.sizes == [], "nothing ran"
