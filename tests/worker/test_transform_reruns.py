"""A shard's files as its last attempt made them (worker/transform.py): its errors file in
record order whichever stage found each bad record; a shard of no good record ends with its
errors file and no part; a rerun after a crash replaces its part and errors file and deletes
those of an earlier attempt it did not write again. Over a directory and SeaweedFS in turn."""

from __future__ import annotations

import io

import orjson
import pyarrow.parquet as pq
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import DEFAULT_TENANT, JobStatus
from tests.worker.test_batching import outputs_of, read
from tests.worker.test_transform import (
    ImageRunner,
    batcher,
    fetch,
    make_transform,
    put,
    run,
    table,
    the_transform,
)
from tffleet.datasets.locations import resolve
from tffleet.settings import Settings

Sessions = sessionmaker[Session]


@pytest.fixture
def settings(object_store_url: str) -> Settings:
    return Settings(object_store=object_store_url)


def errors_of(settings: Settings, transform_id: str, shard: int = 0) -> list[dict[str, object]]:
    found = fetch(settings, f"tffleet://transforms/{transform_id}/errors/part-{shard:05d}.jsonl")
    assert found is not None, "an errors file"
    return [orjson.loads(line) for line in found.splitlines()]


def test_the_errors_file_lists_bad_records_in_record_order_whoever_found_them(
    sessions: Sessions, settings: Settings
) -> None:
    # In one batch (records 8 to 15): 15 is null (the reader's), 14 NaN (the mapping's), 13
    # makes the model raise (found last, by the forward pass).
    uri = put(settings, "in.parquet", table(16, null=[15], nan=[14]))
    transform_id, (job_id,) = make_transform(
        sessions, settings, uri, format="parquet", shard_records=16,
        columns={"image": "pixels"}, key="id",
    )  # fmt: skip
    run(batcher(sessions, settings), [job_id], ImageRunner())

    errors = errors_of(settings, transform_id)
    assert [(e["index"], e["key"]) for e in errors] == [(13, "r13"), (14, "r14"), (15, None)]


def test_a_shard_of_no_good_record_ends_with_its_errors_file_and_no_part(
    sessions: Sessions, settings: Settings
) -> None:
    uri = put(settings, "in.parquet", table(6, null=range(6)))
    transform_id, (job_id,) = make_transform(
        sessions, settings, uri, format="parquet", shard_records=6,
        columns={"image": "pixels"}, key="id",
    )  # fmt: skip
    part = f"tffleet://transforms/{transform_id}/part-00000.parquet"
    put_at(settings, part, b"a part an earlier attempt wrote")
    runner = ImageRunner()
    run(batcher(sessions, settings), [job_id], runner)

    assert read(sessions, job_id).status == JobStatus.SUCCEEDED and runner.sizes == []
    assert {k: int(v) for k, v in outputs_of(sessions, job_id).items()} == {
        "records": 6, "succeeded": 0, "failed": 6,
    }  # fmt: skip
    assert [e["index"] for e in errors_of(settings, transform_id)] == list(range(6))
    assert fetch(settings, part) is None, "no part, not even an earlier attempt's"
    row = the_transform(sessions, transform_id)
    assert (row.status, row.records_succeeded, row.records_failed) == ("succeeded", 0, 6)


def test_a_rerun_without_bad_records_deletes_an_earlier_attempts_errors_file(
    sessions: Sessions, settings: Settings
) -> None:
    # The first attempt (a NaN it no longer has: say, the file put again) wrote a part and an
    # errors file, then its worker died before the shard completed.
    uri = put(settings, "in.parquet", table(6))
    transform_id, (job_id,) = make_transform(
        sessions, settings, uri, format="parquet", shard_records=6,
        columns={"image": "pixels"}, key="id",
    )  # fmt: skip
    out = f"tffleet://transforms/{transform_id}"
    put_at(settings, f"{out}/part-00000.parquet", b"half of what came before")
    put_at(settings, f"{out}/errors/part-00000.jsonl", b'{"index":2,"key":"r2","reason":"old"}\n')
    run(batcher(sessions, settings), [job_id], ImageRunner())

    part = fetch(settings, f"{out}/part-00000.parquet")
    assert part is not None
    assert pq.read_table(io.BytesIO(part)).column("id").to_pylist() == [f"r{i}" for i in range(6)]
    assert fetch(settings, f"{out}/errors/part-00000.jsonl") is None


def put_at(settings: Settings, uri: str, data: bytes) -> None:
    location = resolve(uri, DEFAULT_TENANT, settings, write=True)
    location.store.put(location.key, data)
