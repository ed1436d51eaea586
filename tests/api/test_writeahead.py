"""Objects written before their rows (api/writeahead.py): named as garbage ahead of the write,
claimed by the transaction that commits the row, swept once due when that never happens, and a
row committed too late refused. Real database and a real directory store (S3 behaves alike:
tests/objectstore)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api import references, writeahead
from api.ingest import Ingested, Submission
from db import clock, jobs, objects
from db.ids import new_job_id
from db.models import ObjectGarbage, Upload
from db.objects import CLAIM_MARGIN
from tests.api.conftest import Api, OpenApi, count_jobs, envelope
from tffleet import tensors
from tffleet.errors import ServiceUnavailable
from tffleet.objectstore import ObjectStore, keys
from worker import garbage

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("object_store_url", ["file"], indirect=True),
]

Sessions = sessionmaker[Session]

X = np.arange(24, dtype=np.float32).reshape(6, 4)  # 96 bytes: over the 64 of `small_inline`


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.fixture
async def small_inline(object_store: ObjectStore, open_api: OpenApi) -> AsyncIterator[Api]:
    """Inputs over 64 bytes go to the store."""
    async with open_api(inline_max_bytes=64) as running:
        yield running


def garbage_rows(sessions: Sessions) -> list[tuple[str, datetime | None]]:
    with sessions() as session:
        return [(g.key, g.not_before) for g in session.scalars(select(ObjectGarbage))]


def count_uploads(sessions: Sessions) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Upload)) or 0)


def db_now(sessions: Sessions) -> datetime:
    with sessions() as session:
        return clock.now(session)


async def test_what_is_committed_leaves_no_garbage(
    small_inline: Api, object_store: ObjectStore
) -> None:
    api = small_inline
    upload = await api.client.post(
        "/v1/uploads", content=npy(X), headers={"Content-Type": tensors.NPY}
    )
    assert upload.status_code == 201, upload.text
    json_job = await api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": envelope(X)}}
    )
    streamed = await api.client.post(
        "/v1/jobs",
        content=npy(X + 1),
        headers={"Content-Type": tensors.NPY},
        params={"model": "mlp"},
    )
    assert json_job.status_code == streamed.status_code == 202, streamed.text
    # A keyed request stored, replayed (its second objects deleted at once), and refused (409).
    keyed = {"model": "mlp", "inputs": {"x": envelope(X + 2)}}
    headers = {"Idempotency-Key": "wa-1"}
    for body, status in (
        (keyed, 202),
        (keyed, 202),
        ({"model": "mlp", "inputs": {"x": envelope(X + 3)}}, 409),
    ):
        answer = await api.client.post("/v1/jobs", json=body, headers=headers)
        assert answer.status_code == status, answer.text

    assert garbage_rows(api.sessions) == []
    assert object_store.total_bytes()[0] == 4  # the upload and three jobs' inputs


async def test_a_write_whose_row_never_commits_is_swept_after_the_grace(
    small_inline: Api, object_store: ObjectStore
) -> None:
    """The API dies between writing an object and committing its row: the write-ahead row,
    committed on its own before the write, is what is left, and the sweep deletes the object
    once it is due, not before."""
    key = keys.upload_key("default", keys.new_upload_id())
    await writeahead.write_ahead(small_inline.state, [key])
    await small_inline.state.objects.put_async(key, npy(X))
    # ...and no row ever names it.
    [(named, not_before)] = garbage_rows(small_inline.sessions)
    now = db_now(small_inline.sessions)
    assert named == key and not_before is not None
    assert timedelta(minutes=59) < not_before - now <= timedelta(hours=1)  # the default grace

    swept = garbage.collect(small_inline.sessions, lambda: object_store)
    assert swept.objects_deleted == 0
    assert object_store.size(key) is not None

    later = garbage.collect(
        small_inline.sessions,
        lambda: object_store,
        clock=lambda _: not_before + timedelta(seconds=1),
    )
    assert later.objects_deleted == 1
    assert object_store.size(key) is None
    assert garbage_rows(small_inline.sessions) == []


async def test_rows_committed_after_the_grace_are_refused_and_leave_nothing(
    object_store: ObjectStore, open_api: OpenApi
) -> None:
    """A grace shorter than the claim's margin: every object arrives too late for its row."""
    async with open_api(inline_max_bytes=64, upload_grace_s=1) as api:
        upload = await api.client.post(
            "/v1/uploads", content=npy(X), headers={"Content-Type": tensors.NPY}
        )
        job = await api.client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": envelope(X)}})
        streamed = await api.client.post(
            "/v1/jobs",
            content=npy(X),
            headers={"Content-Type": tensors.NPY},
            params={"model": "mlp"},
        )
        for answer in (upload, job, streamed):
            assert answer.status_code == 503, answer.text
            assert "TFFLEET_UPLOAD_GRACE_S" in answer.json()["error"]["message"]
        assert count_uploads(api.sessions) == count_jobs(api.sessions) == 0
        assert object_store.total_bytes() == (0, 0)
        assert garbage_rows(api.sessions) == []  # deleted at once, and their rows with them


async def test_a_discarded_write_goes_with_its_garbage_row(
    small_inline: Api, object_store: ObjectStore
) -> None:
    """What a failed or replayed request wrote is deleted at once, and then its write-ahead row
    (a store that fails to delete leaves the row, tests/api/test_uploads.py)."""
    key = keys.input_key("default", "0" * 32, "x")
    await writeahead.write_ahead(small_inline.state, [key])
    await small_inline.state.objects.put_async(key, npy(X))
    await writeahead.discard(small_inline.state, [key])
    assert object_store.size(key) is None
    assert garbage_rows(small_inline.sessions) == []


def streamed_job(api: Api, not_before: datetime) -> tuple[jobs.NewJob, str]:
    """A job as a streamed `.npy` body makes it (its input an object of its own under its id),
    with the written-ahead row of that object due at `not_before`; and the object's key."""
    job_id = new_job_id()
    reference = tensors.Reference(
        key=keys.input_key("default", job_id, "x"), dtype="float32", shape=(6, 4), offset=128,
        nbytes=96,
    )  # fmt: skip
    named = {"x": references.Named(None, reference, 224, None)}
    packed = references.pack(
        {}, named, tenant="default", job_id=job_id, inline_max_bytes=64,
        staged=references.Staged(), hashed=False,
    )  # fmt: skip
    with api.sessions.begin() as session:
        objects.write_ahead(session=session, keys=[reference.key], not_before=not_before)
    version = api.state.signatures.resolve("mlp", None)["version"]
    job = jobs.NewJob(
        id=job_id, model="mlp", version=version, samples=6, inputs=packed.blob,
        stored_bytes=packed.stored_bytes,
    )  # fmt: skip
    return job, reference.key


async def test_a_late_request_that_shares_a_transaction_is_refused_alone(
    small_inline: Api,
) -> None:
    """Requests coalesced into one transaction claim their objects' rows in one statement; one
    whose row is nearly due is refused (503) while the others are stored, and its row stays,
    for the request's own discard or the sweeper."""
    now = db_now(small_inline.sessions)
    in_time, _ = streamed_job(small_inline, now + timedelta(hours=1))
    late, late_key = streamed_job(small_inline, now + CLAIM_MARGIN / 2)
    also_in_time, _ = streamed_job(small_inline, now + timedelta(hours=1))

    answers = await asyncio.to_thread(
        small_inline.state.ingestor._write,
        [Submission([in_time]), Submission([late]), Submission([also_in_time])],
    )

    stored, refused, also_stored = answers
    assert isinstance(stored, Ingested) and isinstance(also_stored, Ingested)
    assert [stored.jobs[0]["id"], also_stored.jobs[0]["id"]] == [in_time.id, also_in_time.id]
    assert isinstance(refused, ServiceUnavailable)
    assert "TFFLEET_UPLOAD_GRACE_S" in refused.message
    assert [key for key, _ in garbage_rows(small_inline.sessions)] == [late_key]
    assert count_jobs(small_inline.sessions) == 2
