"""A fake worker of transforms' shards, the client and CLI tests' stand-in for a child's
worker/transform.py, as `FakeWorker` (tests/client/fleet.py) stands in for a worker of jobs. It
claims a transform's queued shards and runs each through the pieces a child does (the shard's
spec read by worker/transform_spec.py, its records by tffleet.datasets, made inputs by
worker/transform_io's `feed`, its part and errors file written by tffleet.datasets' writers),
with `fake_model` for a model, then completes the shard and counts it into its transform in one
transaction, and announces it so that long-polls wake."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import redis
from sqlalchemy import select

from db import jobs, transforms
from db.engine import make_engine, make_sessionmaker
from db.jobs import Lease
from db.models import Job
from tests.client.fleet import SIGNATURES, fake_model
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.datasets import formats, writers
from tffleet.settings import Settings
from worker.transform_io import BadRecord, feed
from worker.transform_spec import ShardSpec, counts, read_spec


class FakeShardWorker:
    def __init__(self, database_url: str, redis_url: str, object_store: str) -> None:
        self._settings = Settings(object_store=object_store)
        self._engine = make_engine(database_url)
        self._sessions = make_sessionmaker(self._engine)
        self._redis = redis.Redis.from_url(redis_url)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[BaseException] = []

    def queued(self) -> list[str]:
        with self._sessions() as session:
            query = select(Job.id).where(Job.transform_id.is_not(None), Job.status == "queued")
            return list(session.scalars(query.order_by(Job.id)))

    def finish(self, job_ids: list[str]) -> list[str]:
        """Run these shards (those still queued) to their end."""
        with self._sessions.begin() as session:
            models = dict(
                session.execute(select(Job.id, Job.model).where(Job.id.in_(job_ids))).all()
            )
            leases = jobs.claim(session=session, job_ids=job_ids, owner="fake", lease_s=60)
        for lease in leases:
            self._run(lease, SIGNATURES[models[lease.job_id]][0])
        done = [lease.job_id for lease in leases]
        if done:
            self._redis.publish(JOBS_DONE_CHANNEL, orjson.dumps(done))
        return done

    def _run(self, lease: Lease, signature: dict[str, Any]) -> None:
        spec = read_spec(lease, signature=signature, settings=self._settings, default_batch=4)
        bad: list[BadRecord] = []
        outputs = _outputs(spec, signature, bad)
        written = writers.write_part(spec.part, spec.output_format, outputs)
        if bad:
            writers.write_errors(spec.errors, bad)
        with self._sessions.begin() as session:
            jobs.complete(
                session=session, results=[(lease, counts(spec.records, written, len(bad)))]
            )
            transforms.shard_finished(
                session,
                job_id=lease.job_id,
                transform_id=spec.transform,
                succeeded=written,
                failed=len(bad),
            )

    def serve(self, delay_s: float = 0.05) -> None:
        """From a thread: run every queued shard, each some `delay_s` after it came."""

        def run() -> None:
            try:
                while not self._stop.wait(delay_s):
                    if ids := self.queued():
                        self.finish(ids)
            except BaseException as exc:  # surfaced in the test by close()
                self.errors.append(exc)

        self._thread = threading.Thread(target=run, name="fake-shard-worker", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._redis.close()
        self._engine.dispose()
        if self.errors:
            raise self.errors[0]


def _outputs(
    spec: ShardSpec, signature: dict[str, Any], bad: list[BadRecord]
) -> Iterator[dict[str, Any]]:
    """The part's batches: the carried column (key or index) and `fake_model`'s outputs (an .npy
    part: its first output alone); the bad records collected into `bad` as they are read."""
    batches = formats.read(
        spec.source,
        spec.format,
        spec.start,
        spec.stop,
        spec.read_columns,
        spec.batch_records,
        key=spec.key,
        info=spec.info,
    )
    for batch in batches:
        fed = feed(batch, signature, spec)
        bad.extend(fed.errors)
        if len(fed):
            outputs = fake_model(fed.arrays)
            if spec.output_format == "npy":
                yield dict(list(outputs.items())[:1])
            else:
                yield {spec.carried: np.asarray(fed.carried), **outputs}
