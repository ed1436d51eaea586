"""A split job's parts over the object store (db/parts.py, worker/objects.py): the joined outputs
over the inline limit go to the store under the job's own outputs/, never into its row, once,
fenced as the join is; and a part whose input is a reference reads only its own rows' bytes.

Over a fake model, on SQLite, with a real store: a directory and the run's SeaweedFS in turn.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, parts
from db.models import DEFAULT_TENANT, JobStatus
from tests.worker.test_batching import model_fn, read, samples
from tests.worker.test_objects import dead_store, make_batcher, run, stored, submit_ref
from tffleet import tensors
from tffleet.objectstore import ObjectStore, StoreUnavailable, keys
from worker.objects import Objects

pytestmark = pytest.mark.both_databases

Sessions = sessionmaker[Session]

# FakeRunner's `y` is 3 float32 a sample: a part's 4 samples (48 bytes) stay inline in its row,
# the job's 10 joined (120 bytes) go to the store.
INLINE_MAX_BYTES = 64


def run_split(sessions: Sessions, store: ObjectStore, job_id: str) -> None:
    """Run a job of 10 samples as three parts on two children."""
    woken: list[list[str]] = []
    objects = Objects(store, inline_max_bytes=INLINE_MAX_BYTES)
    first = make_batcher(sessions, objects, peers=1)
    first.wake = lambda model, version, ids: woken.append(list(ids))
    second = make_batcher(sessions, objects, owner="t2", peers=1)
    run(first, [job_id], max_batch_size=4, buckets=(1, 2, 4))
    (named,) = woken
    run(second, named, max_batch_size=4, buckets=(1, 2, 4))
    run(first, named, max_batch_size=4, buckets=(1, 2, 4))


def test_a_joined_output_over_the_limit_is_an_object_of_the_job(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    x = samples(10, seed=3)
    job_id = submit_ref(sessions, stored(object_store, x))

    run_split(sessions, object_store, job_id)

    job = read(sessions, job_id)
    assert (job.status, job.parts) == (JobStatus.SUCCEEDED, 3)
    assert job.outputs is not None
    (ref,) = tensors.references(job.outputs).values()
    assert ref.key == keys.output_key(DEFAULT_TENANT, job_id, "y")
    assert tensors.unpack(job.outputs, inline_only=True) == {}, "no bytes in the row"
    data = object_store.get(ref.key)
    assert job.stored_bytes == len(data)
    np.testing.assert_allclose(np.load(io.BytesIO(data)), model_fn(x), rtol=1e-6)
    np.testing.assert_allclose(
        tensors.unpack(job.outputs, {ref.key: data})["y"], model_fn(x), rtol=1e-6
    )


def _all_parts_done(sessions: Sessions, store: ObjectStore) -> tuple[str, np.ndarray]:
    """A job of 10 samples split into parts of 4, every part completed, none settled yet."""
    x = samples(10, seed=4)
    job_id = submit_ref(sessions, stored(store, x))
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="c1", lease_s=30)
    with sessions.begin() as session:
        ids = parts.split(session=session, lease=lease, model="m", version=1, part_samples=4)
    assert read(sessions, job_id).stored_bytes == 0, "marked before any part runs"
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=ids, owner="c1", lease_s=30)
    data = store.get(tensors.references(lease.inputs)["x"].key)
    results = [
        (part, tensors.pack({"y": model_fn(tensors.unpack(part.inputs, {key: data})["x"])}))
        for part in leases
        for key in [tensors.references(part.inputs)["x"].key]
    ]
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=results) == 3
    return job_id, x


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_a_join_the_store_does_not_take_writes_nothing_and_runs_again_once(
    sessions: Sessions, object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, x = _all_parts_done(sessions, object_store)
    dead = parts.Spill(dead_store(monkeypatch), INLINE_MAX_BYTES)
    with pytest.raises(StoreUnavailable), sessions.begin() as session:
        parts.settle(session=session, parent_ids=[job_id], spill=dead)
    job = read(sessions, job_id)
    assert (job.status, job.outputs, job.stored_bytes) == (JobStatus.RUNNING, None, 0)

    spill = parts.Spill(object_store, INLINE_MAX_BYTES)
    with sessions.begin() as session:
        assert parts.settle(session=session, parent_ids=[job_id], spill=spill) == [job_id]
    with sessions.begin() as session:  # a second settle finds it ended: nothing more
        assert parts.settle(session=session, parent_ids=[job_id], spill=spill) == []
    job = read(sessions, job_id)
    assert job.status == JobStatus.SUCCEEDED and job.outputs is not None
    (ref,) = tensors.references(job.outputs).values()
    assert job.stored_bytes == ref.offset + ref.nbytes, "counted once"
    data = object_store.get(ref.key)
    np.testing.assert_allclose(
        tensors.unpack(job.outputs, {ref.key: data})["y"], model_fn(x), rtol=1e-6
    )


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_a_join_without_a_store_or_under_the_limit_stays_inline(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    job_id, x = _all_parts_done(sessions, object_store)
    with sessions.begin() as session:
        spill = parts.Spill(object_store, 1 << 20)
        assert parts.settle(session=session, parent_ids=[job_id], spill=spill) == [job_id]
    job = read(sessions, job_id)
    assert job.outputs is not None and tensors.references(job.outputs) == {}
    np.testing.assert_allclose(tensors.unpack(job.outputs)["y"], model_fn(x), rtol=1e-6)
    assert object_store.keys(keys.job_prefix(DEFAULT_TENANT, job_id)) == []


# ─── A part reads its own rows ────────────────────────────────────────────────────────────────────


def _parts(sessions: Sessions, store: ObjectStore, x: np.ndarray) -> list[jobs.Lease]:
    """A job of `x` by reference, split into parts of 4 samples, each claimed."""
    job_id = submit_ref(sessions, stored(store, x))
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="c1", lease_s=30)
    with sessions.begin() as session:
        ids = parts.split(session=session, lease=lease, model="m", version=1, part_samples=4)
    with sessions.begin() as session:
        return jobs.claim(session=session, job_ids=ids, owner="c1", lease_s=30)


def test_each_part_fetches_only_its_rows_and_runs_on_them_without_a_copy(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    x = samples(10, seed=5)
    leases = _parts(sessions, object_store, x)
    fetched = Objects(object_store, inline_max_bytes=INLINE_MAX_BYTES).fetch(leases)

    whole = tensors.references(leases[0].inputs)["x"].key
    assert whole not in fetched.objects, "no part read the whole object"
    assert sorted(buffer.nbytes for buffer in fetched.objects.values()) == sorted(
        tensors.references(lease.inputs)["x"].nbytes for lease in leases
    )
    assert set(fetched.inputs) == {lease.job_id for lease in leases}
    for lease, start in zip(leases, (0, 4, 8), strict=True):
        rows = tensors.unpack(fetched.inputs[lease.job_id], fetched.objects)["x"]
        np.testing.assert_array_equal(rows, x[start : start + 4])
        (buffer,) = (
            fetched.objects[ref.key]
            for ref in tensors.references(fetched.inputs[lease.job_id]).values()
        )
        assert np.shares_memory(rows, np.frombuffer(buffer, dtype=np.uint8)), "a view"


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_a_part_whose_object_is_gone_is_named_missing(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    leases = _parts(sessions, object_store, samples(10, seed=6))
    key = tensors.references(leases[0].inputs)["x"].key
    object_store.delete([key])
    fetched = Objects(object_store, inline_max_bytes=INLINE_MAX_BYTES).fetch(leases)
    assert set(fetched.missing) == {lease.job_id for lease in leases}
    assert all(key in message for message in fetched.missing.values())
    assert fetched.inputs == {}


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_a_part_in_a_store_that_does_not_answer_is_store_unavailable(
    sessions: Sessions, object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = _parts(sessions, object_store, samples(10, seed=6))
    with pytest.raises(StoreUnavailable):
        Objects(dead_store(monkeypatch), inline_max_bytes=INLINE_MAX_BYTES).fetch(leases)
