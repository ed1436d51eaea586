"""Broker faults against real processes: Redis lost, Redis down, a message that is not JSON.

Each test runs its own Redis server (`private_redis`) so it can kill it, and a sweeper with short
intervals so lost wake-ups are republished within seconds. Each ends with a full drain and the
same check: every accepted job ended exactly once (claimed once, run once, its own outputs),
and nothing accepted was lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from db import jobs
from db.engine import make_engine, make_sessionmaker
from db.models import Job
from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.models import build_mlp
from tests.services import PrivateRedis
from tffleet import tensors
from tffleet.broker import RUN_BATCH_TASK, make_celery, queue_for, queue_lists
from tffleet.settings import Settings

pytestmark = pytest.mark.slow

QUEUE = queue_for("mlp")


def queued(client: redis.Redis) -> int:
    """Messages waiting in QUEUE, at every priority."""
    return sum(int(client.llen(name)) for name in queue_lists(QUEUE))


# Lost wake-ups are republished 2 s after their last publish; the sweeper looks twice a second.
SWEEPER_ENV = {"TFFLEET_SWEEP_INTERVAL_S": "0.5", "TFFLEET_REPUBLISH_AFTER_S": "2"}


@pytest.fixture
def model(tmp_path: Path) -> Any:
    """The Keras model the fleet serves (exported to its repository), to check outputs against."""
    return build_mlp(tmp_path / "models")


@pytest.fixture
def fleet(
    fleet_factory: Callable[..., Fleet],
    postgres_url: str,
    private_redis: PrivateRedis,
    model: Any,
    tmp_path: Path,
) -> Fleet:
    clean_database(postgres_url)
    return fleet_factory(
        postgres_url,
        tmp_path / "models",
        devices="cpu:1",
        broker_url=private_redis.url,
        extra_env=SWEEPER_ENV,
    )


def start(fleet: Fleet) -> None:
    """The API, the sweeper and the worker, started at once: the worker's children load
    TensorFlow while the other two get ready."""
    fleet.start_api(wait=False)
    fleet.start_sweeper(wait=False)
    fleet.start_worker()
    fleet.wait_sweeper()


def inputs(count: int, *, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(int(rng.integers(1, 4)), 8)).astype(np.float32) for _ in range(count)]


def submit(fleet: Fleet, xs: Sequence[np.ndarray], concurrency: int = 32) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        limit = asyncio.Semaphore(concurrency)
        async with fleet.ahttp(timeout=30) as client:

            async def one(x: np.ndarray) -> httpx.Response:
                async with limit:
                    return await client.post(
                        "/v1/jobs", json={"model": "mlp", "inputs": {"x": x.tolist()}}
                    )

            return list(await asyncio.gather(*(one(x) for x in xs)))

    return asyncio.run(run())


def accept_all(fleet: Fleet, xs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    responses = submit(fleet, xs)
    assert [r.status_code for r in responses] == [202] * len(xs), responses[0].text
    return {r.json()["id"]: x for r, x in zip(responses, xs, strict=True)}


def worker_finished(fleet: Fleet) -> float:
    """`tffleet_jobs_finished_total{status="succeeded"}` of the running worker (all children)."""
    text = httpx.get(f"http://127.0.0.1:{fleet.metrics_port}/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tffleet_jobs_finished_total" and sample.labels["status"] == "succeeded"
    )


def assert_each_ran_exactly_once(
    fleet: Fleet, accepted: dict[str, np.ndarray], model: Any, *, finished_by_worker: int
) -> None:
    """Drain, then: the table holds exactly the accepted jobs, each succeeded on its first claim
    with the model's own outputs, and the worker counted `finished_by_worker` runs."""
    engine = make_engine(fleet.database_url)
    sessions = make_sessionmaker(engine)
    try:

        def drained() -> bool:
            with sessions() as session:
                busy = session.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(Job.status.in_(["queued", "running"]))
                )
            return busy == 0

        fleet.wait_until(drained, "every job to end", timeout_s=40)
        with sessions() as session:
            rows = session.execute(select(Job.id, Job.status, Job.attempts, Job.outputs)).all()
        assert {row.id for row in rows} == set(accepted), "a job was lost, or one appeared"
        assert Counter(row.status for row in rows) == {"succeeded": len(accepted)}
        assert Counter(row.attempts for row in rows) == {1: len(accepted)}, "claimed twice"
        for row in rows:
            (out,) = tensors.unpack(row.outputs).values()
            np.testing.assert_allclose(out, model(accepted[row.id]), rtol=1e-5, atol=1e-6)
    finally:
        engine.dispose()
    # Run once each: a second run would count here even where fencing kept its result out.
    fleet.wait_until(
        lambda: worker_finished(fleet) == finished_by_worker, "the worker's finished count"
    )
    assert worker_finished(fleet) == finished_by_worker


# (3) Redis restarts empty


def test_500_queued_jobs_all_run_exactly_once_after_redis_restarts_without_them(
    fleet: Fleet, private_redis: PrivateRedis, model: Any
) -> None:
    start(fleet)  # the worker registers the model's signature, then goes away
    fleet.stop("worker")
    accepted = accept_all(fleet, inputs(500, seed=1))  # no worker: all wait in Redis
    with redis.Redis.from_url(private_redis.url) as client:
        assert queued(client) > 0

    private_redis.restart()  # no AOF, no snapshot: every wake-up is gone

    with redis.Redis.from_url(private_redis.url) as client:
        assert queued(client) == 0
    fleet.start_worker()
    assert_each_ran_exactly_once(fleet, accepted, model, finished_by_worker=500)
    assert "republishing" in fleet.log("sweeper")


def test_a_running_worker_keeps_consuming_after_redis_restarts(
    fleet: Fleet, private_redis: PrivateRedis, model: Any
) -> None:
    start(fleet)
    before = accept_all(fleet, inputs(20, seed=2))
    fleet.wait_until(lambda: worker_finished(fleet) == 20, "the first 20 jobs")

    private_redis.restart()
    after = accept_all(fleet, inputs(50, seed=3))

    assert_each_ran_exactly_once(fleet, before | after, model, finished_by_worker=70)


# (4) Redis down at submit


def test_a_submit_while_redis_is_down_is_202_and_durable_and_runs_once_redis_is_back(
    fleet: Fleet, private_redis: PrivateRedis, model: Any
) -> None:
    start(fleet)
    warm = accept_all(fleet, inputs(1, seed=4))
    fleet.wait_until(lambda: worker_finished(fleet) == 1, "the first job")

    private_redis.kill()
    xs = inputs(30, seed=5)
    responses = submit(fleet, xs, concurrency=8)
    ready = fleet.get("/readyz")

    # 202 (stored; the sweeper publishes it later) or 503 (nothing stored): never 202-and-lost.
    assert {r.status_code for r in responses} <= {202, 503}
    accepted = {r.json()["id"]: x for r, x in zip(responses, xs, strict=True) if r.is_success}
    assert len(accepted) == 30, [r.text for r in responses if not r.is_success][:3]
    assert ready.status_code == 503 and ready.json()["broker"].startswith("unreachable")

    private_redis.start()
    assert_each_ran_exactly_once(fleet, warm | accepted, model, finished_by_worker=31)


def test_a_hung_redis_costs_a_submission_about_a_second_and_loses_no_job(
    fleet: Fleet, private_redis: PrivateRedis, model: Any
) -> None:
    start(fleet)
    warm = accept_all(fleet, inputs(1, seed=6))
    fleet.wait_until(lambda: worker_finished(fleet) == 1, "the first job")

    private_redis.pause()  # SIGSTOP: connections stay open, nothing answers
    xs = inputs(10, seed=7)
    took: list[float] = []
    try:
        with fleet.http(timeout=60) as client:
            responses = []
            for x in xs:
                started = time.monotonic()
                responses.append(
                    client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": x.tolist()}})
                )
                took.append(time.monotonic() - started)
    finally:
        private_redis.resume()

    # Not a timing target (see bench/): a bound far above the ~0.4 s one submission may spend,
    # and far below "forever", which is what a publish without socket timeouts took.
    print(f"submissions with Redis hung took {sorted(took)} s")
    assert max(took) < 10, took
    assert [r.status_code for r in responses] == [202] * len(xs), responses[0].text
    accepted = {r.json()["id"]: x for r, x in zip(responses, xs, strict=True)}
    assert_each_ran_exactly_once(fleet, warm | accepted, model, finished_by_worker=11)


# (8) A message that is not JSON


class _Marker:
    """Unpickling this creates a file: if it ever exists, someone unpickled the message."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_a_pickled_message_is_refused_not_run_and_the_worker_stays_healthy(
    fleet: Fleet, private_redis: PrivateRedis, model: Any, tmp_path: Path
) -> None:
    fleet.start_api(wait=False)  # ready before the worker is
    fleet.start_worker()
    # A queued job that no JSON wake-up names (as if the submit's publish had failed).
    x = inputs(1, seed=6)[0]
    engine = make_engine(fleet.database_url)
    with make_sessionmaker(engine).begin() as session:
        (row,) = jobs.create(
            session=session,
            jobs=[jobs.NewJob("mlp", 1, len(x), tensors.pack({"x": x}))],
        )
    target = row.id
    engine.dispose()

    marker = tmp_path / "unpickled"
    sender = make_celery(Settings(broker_url=private_redis.url))
    sender.send_task(
        RUN_BATCH_TASK, args=["mlp", 1, [target], _Marker(marker)], queue=QUEUE, serializer="pickle"
    )
    sender.close()
    fleet.wait_until(lambda: "untrusted content" in fleet.log("worker"), "the refusal")

    assert not marker.exists(), "the worker unpickled the message"
    assert "ContentDisallowed" in fleet.log("worker") and "pickle" in fleet.log("worker")
    with redis.Redis.from_url(private_redis.url) as client:  # refused for good, not redelivered
        assert queued(client) == 0
        assert not client.hlen("unacked")
    polled = fleet.get(f"/v1/jobs/{target}").json()
    assert polled["status"] == "queued" and polled["attempts"] == 0

    # Still healthy: it serves the next JSON message, and the sweeper's wake-up runs the job.
    healthy = accept_all(fleet, [x])
    fleet.start_sweeper()
    assert_each_ran_exactly_once(fleet, {target: x} | healthy, model, finished_by_worker=2)
