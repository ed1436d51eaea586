"""The worker over the object store (worker/objects.py): inputs read from the objects their jobs
reference, outputs too large for a row written as objects, and what a missing object or a store
that does not answer does to a job.

Over a fake model, on SQLite, with a real store: a directory and the run's SeaweedFS in turn
(`object_store`), or an S3 endpoint where nothing listens.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import cache, jobs, parts, tenants
from db.models import DEFAULT_TENANT, JobErrorCode, JobStatus
from tests.objectstore.conftest import dead_store
from tests.worker.test_batching import FakeRunner, model_fn, policy, read, samples, submit
from tests.worker.test_pipeline import wait_for
from tffleet import tensors
from tffleet.announcements import EndedJob
from tffleet.objectstore import ObjectStore, StoreUnavailable, keys, open_store
from tffleet.tensors import Reference
from worker import pipeline
from worker.batching import Batcher
from worker.objects import Fetched, Objects

Sessions = sessionmaker[Session]

# FakeRunner's output `y` is 3 float32 a sample: a job of 2 samples or more goes to the store.
INLINE_MAX_BYTES = 16


def stored(store: ObjectStore, x: np.ndarray, *, tenant: str = DEFAULT_TENANT) -> Reference:
    """`x` as an upload: a whole .npy in the store, and the reference a job's inputs hold."""
    key = keys.upload_key(tenant, keys.new_upload_id())
    data = tensors.write_npy(x)
    store.put(key, data)
    return Reference(key, x.dtype.name, tuple(x.shape), len(data) - x.nbytes, x.nbytes)


def submit_ref(sessions: Sessions, ref: Reference, *, tenant: str = DEFAULT_TENANT) -> str:
    new = jobs.NewJob(
        model="m",
        version=1,
        samples=ref.shape[0],
        inputs=tensors.pack({}, {"x": ref}),
        tenant=tenant,
    )
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=tenant)
        (row,) = jobs.create(session=session, jobs=[new])
        return str(row.id)


def make_batcher(
    sessions: Sessions, objects: Objects, *, owner: str = "t1", peers: int = 0
) -> Batcher:
    def notify(ended: Sequence[str | EndedJob]) -> None:
        pass

    return Batcher(
        sessions=sessions,
        owner=owner,
        lease_s=30,
        notify=notify,
        objects=objects,
        peers=lambda model, version: peers,
    )


def run(batcher: Batcher, job_ids: Sequence[str], runner: Any = None, **kwargs: Any) -> Any:
    return batcher.run(
        model="m", version=1, job_ids=job_ids, runner=runner or FakeRunner(),
        policy=policy(**kwargs),
    )  # fmt: skip


def test_a_referenced_input_is_read_and_a_large_output_is_written_as_a_reference(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    big, small = samples(4, seed=1), samples(1, seed=2)
    by_ref = submit_ref(sessions, stored(object_store, big))
    inline = submit(sessions, small)
    runner = FakeRunner()

    run(make_batcher(sessions, Objects(object_store, inline_max_bytes=INLINE_MAX_BYTES)),
        [by_ref, inline], runner)  # fmt: skip

    assert runner.sizes == [8], "both jobs in one forward pass (5 samples, padded)"
    job = read(sessions, by_ref)
    assert job.status == JobStatus.SUCCEEDED and job.outputs is not None
    (ref,) = tensors.references(job.outputs).values()
    assert ref.key == keys.output_key(DEFAULT_TENANT, by_ref, "y")
    data = object_store.get(ref.key)
    np.testing.assert_allclose(np.load(io.BytesIO(data)), model_fn(big), rtol=1e-6)
    np.testing.assert_allclose(
        tensors.unpack(job.outputs, {ref.key: data})["y"], model_fn(big), rtol=1e-6
    )
    assert job.stored_bytes == len(data)
    # 12 bytes of outputs: inline, and the job owns nothing in the store.
    other = read(sessions, inline)
    assert other.outputs is not None and not tensors.references(other.outputs)
    np.testing.assert_allclose(tensors.unpack(other.outputs)["y"], model_fn(small), rtol=1e-6)
    assert other.stored_bytes is None


def test_a_job_alone_runs_on_a_view_of_its_object_and_a_batch_copies_once(
    tmp_path: Any,
) -> None:
    store = open_store((tmp_path / "objects").as_uri())
    xs = [samples(3, seed=i) for i in range(2)]
    leases = [
        jobs.Lease(f"j{i}", "t1", 1, 3, 0, tensors.pack({}, {"x": stored(store, x)}))
        for i, x in enumerate(xs)
    ]
    objects = Objects(store, inline_max_bytes=INLINE_MAX_BYTES)

    fetched = objects.fetch(leases[:1])
    (group,) = pipeline.decode(leases[:1], runner=FakeRunner(), objects=fetched.objects).groups
    (buffer,) = fetched.objects.values()
    assert np.shares_memory(group.batch["x"], np.frombuffer(buffer, dtype=np.uint8))

    fetched = objects.fetch(leases)
    (group,) = pipeline.decode(leases, runner=FakeRunner(), objects=fetched.objects).groups
    np.testing.assert_array_equal(group.batch["x"], np.concatenate(xs))


def test_a_missing_input_object_fails_that_job_alone_input_missing_and_is_not_retried(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    kept_ref, gone_ref = (
        stored(object_store, samples(1, seed=1)),
        stored(object_store, samples(1, seed=2)),
    )
    kept, gone = submit_ref(sessions, kept_ref), submit_ref(sessions, gone_ref)
    object_store.delete([gone_ref.key])  # deleted after submit
    batcher = make_batcher(sessions, Objects(object_store, inline_max_bytes=INLINE_MAX_BYTES))

    report = run(batcher, [kept, gone])

    assert (report.succeeded, report.failed) == (1, 1)
    assert read(sessions, kept).status == JobStatus.SUCCEEDED
    job = read(sessions, gone)
    assert (job.status, job.error_code, job.attempts) == (
        JobStatus.FAILED, JobErrorCode.INPUT_MISSING, 1,
    )  # fmt: skip
    assert "input 'x'" in (job.error_message or "") and "deleted" in (job.error_message or "")
    assert run(batcher, [gone]).claimed == 0, "never runs again"


def test_a_store_that_does_not_answer_puts_the_batch_back_without_an_attempt(
    sessions: Sessions, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store((tmp_path / "objects").as_uri())
    x = samples(2, seed=3)
    by_ref, inline = submit_ref(sessions, stored(store, x)), submit(sessions, samples(1, seed=4))
    down = make_batcher(sessions, Objects(dead_store(monkeypatch), inline_max_bytes=1 << 20))

    with pytest.raises(StoreUnavailable):
        run(down, [by_ref, inline])

    for job_id in (by_ref, inline):
        job = read(sessions, job_id)
        assert (job.status, job.attempts, job.error_code) == (JobStatus.QUEUED, 0, None)
    assert not down._heartbeat.kept()
    # The store is back: the jobs run, in one batch, as if never claimed.
    report = run(make_batcher(sessions, Objects(store, inline_max_bytes=1 << 20)), [by_ref])
    assert report.succeeded == 2
    assert read(sessions, by_ref).attempts == 1


def test_an_output_the_store_does_not_take_puts_its_job_back_and_the_others_end(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    large, small = submit(sessions, samples(2, seed=5)), submit(sessions, samples(1, seed=6))
    objects = Objects(dead_store(monkeypatch), inline_max_bytes=INLINE_MAX_BYTES)

    with pytest.raises(StoreUnavailable):
        run(make_batcher(sessions, objects), [large, small])

    job = read(sessions, large)
    assert (job.status, job.attempts, job.outputs) == (JobStatus.QUEUED, 0, None)
    # Marked as owning objects before any write: whoever deletes it deletes its prefix too.
    assert job.stored_bytes == 0
    assert read(sessions, small).status == JobStatus.SUCCEEDED


class Spying(Objects):
    """The real store's objects, recording which keys each fetch asked for."""

    fetched: list[set[str]]

    def fetch(self, leases: Sequence[jobs.Lease]) -> Fetched:
        found = super().fetch(leases)
        self.fetched.append(set(found.objects))
        return found


class During(FakeRunner):
    """A fake model whose first forward pass waits for `until` (the device is busy meanwhile)."""

    def __init__(self, until: Callable[[], bool]) -> None:
        super().__init__()
        self.until = until
        self.waited: bool | None = None

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.waited is None:
            self.waited = wait_for(self.until)
        return super().run(batch)


def test_the_next_batch_objects_are_fetched_while_one_is_on_the_device(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    refs = [stored(object_store, samples(1, seed=i)) for i in range(4)]
    ids = [submit_ref(sessions, ref) for ref in refs]
    objects = Spying(object_store, inline_max_bytes=INLINE_MAX_BYTES)
    objects.fetched = []
    runner = During(until=lambda: len(objects.fetched) == 2)

    report = run(make_batcher(sessions, objects), ids, runner, max_batch_size=2)

    assert runner.waited, "batch 1's objects arrived while batch 0 was on the device"
    assert report.succeeded == 4
    assert set().union(*objects.fetched) == {ref.key for ref in refs}


def test_the_parts_of_a_split_job_reference_slices_of_its_object(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    x = samples(10, seed=7)
    ref = stored(object_store, x)
    job_id = submit_ref(sessions, ref)
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="c1", lease_s=30)
    with sessions.begin() as session:
        ids = parts.split(session=session, lease=lease, model="m", version=1, part_samples=4)
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=ids, owner="c1", lease_s=30)

    data = object_store.get(ref.key)
    for part, start in zip(leases, (0, 4, 8), strict=True):
        (part_ref,) = tensors.references(part.inputs).values()
        assert part_ref.key == ref.key, "the same object, not a copy"
        rows = tensors.unpack(part.inputs, {ref.key: data})["x"]
        np.testing.assert_array_equal(rows, x[start : start + 4])


def test_a_split_job_with_a_referenced_input_runs_on_two_children(
    sessions: Sessions, object_store: ObjectStore
) -> None:
    x = samples(10, seed=8)
    job_id = submit_ref(sessions, stored(object_store, x))
    woken: list[list[str]] = []
    first = make_batcher(sessions, Objects(object_store, inline_max_bytes=1 << 20), peers=1)
    first.wake = lambda model, version, ids: woken.append(list(ids))
    # Its task ends with parts waiting: it asks for a wake-up unless one waits (the share does).
    nudged: list[list[str]] = []
    first.wake_once = lambda model, version, ids: nudged.append(list(ids))
    second = make_batcher(
        sessions, Objects(object_store, inline_max_bytes=1 << 20), owner="t2", peers=1
    )

    run(first, [job_id], max_batch_size=4, buckets=(1, 2, 4))
    (named,) = woken
    assert len(nudged) == 1 and set(nudged[0]) <= set(named)
    run(second, named, max_batch_size=4, buckets=(1, 2, 4))
    run(first, named, max_batch_size=4, buckets=(1, 2, 4))

    job = read(sessions, job_id)
    assert (job.status, job.parts) == (JobStatus.SUCCEEDED, 3)
    assert job.outputs is not None
    np.testing.assert_allclose(tensors.unpack(job.outputs)["y"], model_fn(x), rtol=1e-6)


def test_outputs_that_hold_references_are_not_cached(sessions: Sessions) -> None:
    ids = [submit(sessions, samples(1, seed=i)) for i in range(2)]
    with sessions.begin() as session:
        held = jobs.claim(session=session, job_ids=ids, owner="t1", lease_s=30)
    by_ref, inline = (
        jobs.Lease(**{**lease.__dict__, "cache_key": f"key{i}"}) for i, lease in enumerate(held)
    )
    with sessions.begin() as session:
        assert jobs.reserve_storage(session=session, leases=[by_ref]) == [by_ref]
        written = jobs.complete(
            session=session,
            results=[(by_ref, b"outputs with a reference"), (inline, b"inline outputs")],
            stored={by_ref.job_id: 100},
        )
    assert written == 2
    with sessions() as session:
        found = cache.answer(
            session=session,
            rows=[{"id": "a", "cache_key": "key0"}, {"id": "b", "cache_key": "key1"}],
            now=read(sessions, ids[0]).finished_at,
        )
    assert found == {"b"}
    assert read(sessions, by_ref.job_id).stored_bytes == 100
    assert read(sessions, inline.job_id).stored_bytes is None
