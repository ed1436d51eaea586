"""What a job cost (DESIGN §15), as the worker records it: each forward pass's seconds split among
its jobs by samples (worker/pipeline.py), added to each job's `device_s` and appended to
`usage_records` per tenant in the transaction that writes the batch (worker/writer.py), and
counted in `tffleet_device_seconds_total{tenant,model}`.

Over a fake model that takes a measurable time per pass, on SQLite and on PostgreSQL. The same
sums over a fleet of real processes and a real model: tests/e2e/test_usage.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client import REGISTRY
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from db import clock, transform_control, usage
from db.jobs import Lease
from db.models import Job, UsageRecord
from db.transform_views import transform_out
from tests.worker.test_batching import POISON, FakeRunner, policy, read, samples, submit
from tests.worker.test_split import Child
from tests.worker.test_transform import ImageRunner, batcher, make_transform, put, run, table
from tffleet.broker import Publisher, make_celery
from tffleet.settings import Settings
from worker import pipeline
from worker.batching import Batcher
from worker.pipeline import Arrays
from worker.sweeper import Sweeper

pytestmark = pytest.mark.both_databases

Sessions = sessionmaker[Session]

PASS_S = 0.02  # what one forward pass of `Slow` takes, at least


class Slow(FakeRunner):
    """The fake model, with each pass taking PASS_S more per 4 rows: a time worth splitting."""

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(PASS_S * max(1, len(batch["x"]) // 4))
        return super().run(batch)


@pytest.fixture(autouse=True)
def no_records(sessions: Sessions) -> Iterator[None]:
    """usage_records of this test alone (the suite's truncation does not empty them)."""
    with sessions.begin() as session:
        session.execute(delete(UsageRecord))
    yield
    with sessions.begin() as session:
        session.execute(delete(UsageRecord))


def busy(device: str) -> float:
    labels = {"device": device, "model": "m"}
    return REGISTRY.get_sample_value("tffleet_device_busy_seconds_total", labels) or 0.0


def device_seconds(tenant: str) -> float:
    labels = {"tenant": tenant, "model": "m"}
    return REGISTRY.get_sample_value("tffleet_device_seconds_total", labels) or 0.0


def records(sessions: Sessions) -> dict[str, tuple[int, int, float]]:
    """(jobs, samples, device_s) per tenant, summed over usage_records."""
    with sessions() as session:
        rows = session.execute(
            select(
                UsageRecord.tenant,
                func.sum(UsageRecord.jobs),
                func.sum(UsageRecord.samples),
                func.sum(UsageRecord.device_s),
            ).group_by(UsageRecord.tenant)
        ).all()
    return {tenant: (int(j), int(s), float(d)) for tenant, j, s, d in rows}


def lease(job_id: str, samples: int) -> Lease:
    return Lease(job_id=job_id, owner="t", attempt=1, samples=samples, priority=0, inputs=b"")


def test_each_pass_is_split_among_the_jobs_whose_rows_it_ran_by_their_samples() -> None:
    # Jobs of 1, 3 and 6 samples in one group, passes of 4 rows: [a b b b] [c c c c] [c c].
    a, b, c = lease("a", 1), lease("b", 3), lease("c", 6)
    x = samples(10, seed=1)
    group = pipeline.Group(
        jobs=[(a, {"x": x[:1]}), (b, {"x": x[1:4]}), (c, {"x": x[4:]})], batch={"x": x}
    )
    passes: list[float] = []

    class Timed(FakeRunner):
        def run(self, batch: Arrays) -> Arrays:
            started = time.perf_counter()
            time.sleep(0.01 * len(passes) + 0.01)
            out = super().run(batch)
            passes.append(time.perf_counter() - started)
            return out

    decoded = pipeline.Decoded(leases=[a, b, c], groups=[group], failed=[])
    ran = pipeline.forward(decoded, runner=Timed(), policy=policy(max_batch_size=4, buckets=(4,)))

    assert len(passes) == 3
    assert sum(ran.device_s.values()) == pytest.approx(ran.busy_s, rel=1e-9)
    # Each share is its rows of each pass (the runner's own time; the pass's a little more).
    assert ran.device_s["a"] == pytest.approx(passes[0] / 4, rel=0.1)
    assert ran.device_s["b"] == pytest.approx(passes[0] * 3 / 4, rel=0.1)
    assert ran.device_s["c"] == pytest.approx(passes[1] + passes[2], rel=0.1)


def test_a_batchs_device_seconds_go_to_its_jobs_records_and_counter_and_add_up_to_busy(
    sessions: Sessions,
) -> None:
    sizes = [1, 2, 3, 4, 1, 5, 2, 6]
    ids = {
        submit(sessions, samples(n, seed=i), tenant="acme" if i % 2 else "zeta"): n
        for i, n in enumerate(sizes)
    }
    before = busy("cpu:usage"), device_seconds("acme"), device_seconds("zeta")
    batcher = Batcher(
        sessions=sessions, owner="t1", lease_s=30, notify=lambda e: None, device="cpu:usage"
    )

    batcher.run(model="m", version=1, job_ids=list(ids), runner=Slow(), policy=policy(8))

    spent = busy("cpu:usage") - before[0]
    assert spent >= PASS_S
    jobs = {job_id: read(sessions, job_id) for job_id in ids}
    assert all(job.device_s is not None and job.device_s > 0 for job in jobs.values())
    assert sum(job.device_s or 0 for job in jobs.values()) == pytest.approx(spent, rel=1e-6)
    found = records(sessions)
    assert set(found) == {"acme", "zeta"}
    for tenant, last in (("acme", before[1]), ("zeta", before[2])):
        mine = [job for job in jobs.values() if job.tenant == tenant]
        jobs_n, samples_n, device_s = found[tenant]
        assert (jobs_n, samples_n) == (len(mine), sum(job.samples for job in mine))
        assert device_s == pytest.approx(sum(job.device_s or 0 for job in mine), rel=1e-6)
        assert device_seconds(tenant) - last == pytest.approx(device_s, rel=1e-6)
    # The records' queue and run time are the jobs' own.
    with sessions() as session:
        run_s = session.scalar(select(func.sum(UsageRecord.run_s)))
    views = [usage.usage_out(created_at=j.created_at, started_at=j.started_at,
                             finished_at=j.finished_at, device_s=j.device_s, samples=j.samples)
             for j in jobs.values()]  # fmt: skip
    assert run_s == pytest.approx(sum(v["run_s"] for v in views), abs=1e-3)


def test_a_job_that_made_its_pass_raise_keeps_its_share_of_the_passes_it_was_in(
    sessions: Sessions,
) -> None:
    bad = samples(2, seed=1)
    bad[1, 0] = POISON
    good = submit(sessions, samples(2, seed=2))
    failed = submit(sessions, bad)
    before = busy("cpu:poison")
    batcher = Batcher(
        sessions=sessions, owner="t1", lease_s=30, notify=lambda e: None, device="cpu:poison"
    )

    batcher.run(model="m", version=1, job_ids=[good, failed], runner=Slow(), policy=policy(8))

    spent = busy("cpu:poison") - before
    got = read(sessions, good), read(sessions, failed)
    assert [job.status for job in got] == ["succeeded", "failed"]
    # Three passes: both together (it raised), then each alone: each job had half the first and
    # all of its own, the failed one's too.
    assert all((job.device_s or 0) >= 1.4 * PASS_S for job in got)
    assert sum(job.device_s or 0 for job in got) == pytest.approx(spent, rel=1e-6)
    assert records(sessions)["default"][:2] == (2, 4)


def test_a_split_job_sums_its_parts_and_counts_once(sessions: Sessions) -> None:
    job_id = submit(sessions, samples(10, seed=3), tenant="acme")
    first, second = Child(sessions, "c1"), Child(sessions, "c2")
    first.runner = second.runner = Slow()

    first.run([job_id])
    second.run(first.woken[0])
    first.run(first.woken[0])

    job = read(sessions, job_id)
    assert job.status == "succeeded"
    jobs_n, samples_n, device_s = records(sessions)["acme"]
    assert (jobs_n, samples_n) == (1, 10)
    assert job.device_s == pytest.approx(device_s, rel=1e-6)
    assert device_s >= 3 * PASS_S * 0.9  # three parts, a pass each
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 1  # parts gone


def test_a_transforms_shards_keep_their_device_seconds_and_the_transform_sums_them(
    sessions: Sessions, tmp_path: Path
) -> None:
    settings = Settings(object_store=(tmp_path / "objects").as_uri())
    uri = put(settings, "usage.parquet", table(24))
    transform_id, ids = make_transform(
        sessions, settings, uri, format="parquet", shard_records=12,
        columns={"image": "pixels"}, key="id",
    )  # fmt: skip
    before = busy("")
    b = batcher(sessions, settings)
    for job_id in ids:  # a shard runs alone
        run(b, [job_id], ImageRunner())

    shards = [read(sessions, job_id) for job_id in ids]
    assert [shard.status for shard in shards] == ["succeeded", "succeeded"]
    assert all((shard.device_s or 0) > 0 for shard in shards)
    total = sum(shard.device_s or 0 for shard in shards)
    assert total == pytest.approx(busy("") - before, rel=1e-6)
    with sessions() as session:
        found = transform_control.get(session=session, transform_id=transform_id)
        shown = transform_out(
            found, running=transform_control.running(session=session, transform=found)
        )
    assert shown["usage"]["device_s"] == pytest.approx(total, abs=1e-5)
    assert shown["usage"]["samples"] == 24
    jobs_n, samples_n, device_s = records(sessions)["default"]
    assert (jobs_n, samples_n) == (2, 24)
    assert device_s == pytest.approx(total, rel=1e-6)


def test_the_sweeper_folds_past_hours_to_a_row_per_hour_tenant_and_model(
    sessions: Sessions, redis_url: str
) -> None:
    with sessions() as session:
        now = clock.now(session)
    past = usage.hour(now) - timedelta(hours=3)
    for at, tenant, model in [
        (past, "acme", "mlp"), (past + timedelta(minutes=59), "acme", "mlp"),
        (past, "acme", "cnn"), (past, "zeta", "mlp"), (past - timedelta(hours=1), "acme", "mlp"),
        (now, "acme", "mlp"), (now, "acme", "mlp"),  # this hour: left as it is
    ]:  # fmt: skip
        cost = usage.Batch(model)
        cost.add(tenant, ended=True, samples=2, device_s=0.5, queue_s=0.25, run_s=1.0)
        with sessions.begin() as session:
            usage.record(session, cost, at=at)
    before = summed(sessions)

    settings = Settings(database_url="sqlite://", broker_url=redis_url)
    with redis.Redis.from_url(redis_url) as client:
        Sweeper(sessions, Publisher(make_celery(settings)), settings, client).sweep_once()

    assert summed(sessions) == before
    with sessions() as session:
        rows = session.execute(
            select(UsageRecord.bucket, UsageRecord.tenant, UsageRecord.model, UsageRecord.jobs)
        ).all()
    assert sorted((b == usage.hour(now), t, m, j) for b, t, m, j in rows) == [
        (False, "acme", "cnn", 1),
        (False, "acme", "mlp", 1),  # the hour before: one row
        (False, "acme", "mlp", 2),  # two rows folded
        (False, "zeta", "mlp", 1),
        (True, "acme", "mlp", 1),
        (True, "acme", "mlp", 1),
    ]


def summed(sessions: Sessions) -> list[tuple[object, ...]]:
    """Each group's sums, per tenant and model."""
    with sessions() as session:
        found = usage.summarize(
            session=session,
            start=datetime(2000, 1, 1, tzinfo=UTC),
            end=datetime(2100, 1, 1, tzinfo=UTC),
            group_by=usage.GroupBy.TENANT,
        )
        found += usage.summarize(
            session=session,
            start=datetime(2000, 1, 1, tzinfo=UTC),
            end=datetime(2100, 1, 1, tzinfo=UTC),
            group_by=usage.GroupBy.MODEL,
        )
    return [tuple(group.values()) for group in found]
