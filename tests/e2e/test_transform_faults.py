"""A transform survives faults with nothing lost or doubled (issue 27 item 6, DESIGN §4 and §14).

A Parquet file of 2,000 records in four shards is transformed by a real fleet (API, a worker of
one CPU child, a sweeper with short leases) while one of its processes fails mid-transform:

1. the child running a shard is killed (SIGKILL): the shard is taken back and run again;
2. the API process is killed and started again: waiting on the transform works after;
3. Redis restarts empty: the fleet's wake-ups are gone, the database still holds every shard.

Each ends with the same check (`assert_whole`): the transform succeeded; its parts hold every
record's output exactly once (the keys counted: none missing, none doubled), in input order,
equal to the model's own run in-process over the same file; and a shard that had finished before
the fault was never run again (its job: one attempt, one start in its history).

The model is `faulty` of tests/e2e/models.py (y = x @ W, as small as the MLP) because its forward
pass sleeps for the value of each record's first feature: every batch of a shard takes
`SLEEP_S`, so a shard runs long enough to be caught mid-run, whatever the machine's speed.
"""

from __future__ import annotations

import io
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from db.engine import make_engine
from db.models import DEFAULT_TENANT, Job
from tests.e2e.conftest import Fleet, clean_database
from tests.e2e.models import SLEEP_COLUMN, build_faulty
from tests.services import PrivateRedis
from tffleet.objectstore import ObjectStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

RECORDS = 2000
# Four shards, four parts: one finished before the fault, one caught in it, and others after.
SHARD_RECORDS = 500
BATCH_RECORDS = 50  # ten forward passes a shard
SLEEP_S = 0.25  # each forward pass: a shard runs about 2.5 s, several progress reports long
SHARDS = RECORDS // SHARD_RECORDS
DATASET = "faults/in.parquet"

# Short leases and a sweeper that looks twice a second (as tests/e2e/faults.py).
FAST_RECOVERY = {
    "TFFLEET_LEASE_S": "3",
    "TFFLEET_SWEEP_INTERVAL_S": "0.5",
    "TFFLEET_REPUBLISH_AFTER_S": "2",
    "TFFLEET_MAX_ATTEMPTS": "3",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


# The shard jobs, as the database holds them


@dataclass(frozen=True)
class ShardRow:
    id: str
    shard: int
    status: str
    attempts: int
    samples: int
    samples_done: int | None
    lease_owner: str | None
    history: list[str]  # its events, oldest first: "started", "requeued", ...

    @property
    def pid(self) -> int:
        """The pid of the child holding its lease (`host/pid/device/...`)."""
        assert self.lease_owner is not None, self
        return int(self.lease_owner.split("/")[1])


class Shards:
    """The test's view of one transform's shard jobs."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url, pool_pre_ping=True)
        self.transform_id = ""

    def rows(self) -> list[ShardRow]:
        query = (
            select(Job.id, Job.shard, Job.status, Job.attempts, Job.samples, Job.samples_done,
                   Job.lease_owner, Job.history)
            .where(Job.transform_id == self.transform_id)
            .order_by(Job.shard)
        )  # fmt: skip
        with self.engine.connect() as conn:
            return [_shard_row(row) for row in conn.execute(query)]

    def row(self, job_id: str) -> ShardRow:
        return next(row for row in self.rows() if row.id == job_id)

    def succeeded(self) -> set[str]:
        return {row.id for row in self.rows() if row.status == "succeeded"}

    def mid_shard(self) -> ShardRow | None:
        """A shard that has reported progress and has records left to run, once another shard
        has finished (so the fault falls between a finished shard and unfinished ones)."""
        rows = self.rows()
        if not any(row.status == "succeeded" for row in rows):
            return None
        running = [
            row
            for row in rows
            if row.status == "running" and 0 < (row.samples_done or 0) < row.samples
        ]
        return running[0] if running else None


def _shard_row(row: Any) -> ShardRow:
    return ShardRow(
        id=row.id, shard=row.shard, status=row.status, attempts=row.attempts,
        samples=row.samples, samples_done=row.samples_done, lease_owner=row.lease_owner,
        history=[line.split("\t")[0] for line in (row.history or "").splitlines()],
    )  # fmt: skip


@pytest.fixture
def shards(postgres_url: str) -> Iterator[Shards]:
    view = Shards(postgres_url)
    yield view
    view.engine.dispose()


# The fleet, the file, the transform


@pytest.fixture
def make_fleet(
    fleet_factory: Callable[..., Fleet], postgres_url: str, object_store_url: str, tmp_path: Path
) -> Callable[..., Fleet]:
    """An API, a worker (one CPU child) and a sweeper serving `faulty`, on the test's store
    (`object_store_url` has set it in the environment they inherit)."""
    clean_database(postgres_url)
    build_faulty(tmp_path / "models")

    def make(**kwargs: Any) -> Fleet:
        fleet = fleet_factory(
            postgres_url, tmp_path / "models", devices="cpu:1", extra_env=FAST_RECOVERY, **kwargs
        )
        fleet.start_api(wait=False)  # the API and the sweeper start while the worker does
        fleet.start_sweeper(wait=False)
        fleet.start_worker()
        fleet.wait_sweeper()
        return fleet

    return make


def put_dataset(store: ObjectStore) -> None:
    """The input: RECORDS records with a key, in row groups smaller than a shard."""
    rng = np.random.default_rng(27)
    x = rng.standard_normal((RECORDS, 4)).astype(np.float32)
    x[:, SLEEP_COLUMN] = SLEEP_S
    table = pa.table(
        {
            "id": pa.array([f"rec-{i:05d}" for i in range(RECORDS)]),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=300)
    store.put(f"{DEFAULT_TENANT}/datasets/{DATASET}", sink.getvalue())


def submit(fleet: Fleet, shards: Shards) -> str:
    body = {
        "model": "faulty",
        "input": {"uri": f"tffleet://datasets/{DATASET}", "key": "id"},
        "output": {"format": "parquet"},
        "shard_records": SHARD_RECORDS,
        "batch_records": BATCH_RECORDS,
    }
    with fleet.http(timeout=60) as client:
        response = client.post("/v1/transforms", json=body)
    assert response.status_code == 202, response.text
    shards.transform_id = str(response.json()["id"])
    return shards.transform_id


def wait_end(fleet: Fleet, transform_id: str) -> dict[str, Any]:
    """GET /v1/transforms/{id}?wait= until it ends."""
    out: dict[str, Any] = {}
    with fleet.http(timeout=60) as client:
        for _ in range(8):
            response = client.get(f"/v1/transforms/{transform_id}?wait=20")
            assert response.status_code == 200, response.text
            out = response.json()
            if out["status"] in ("succeeded", "failed", "canceled"):
                return out
    raise AssertionError(f"transform {transform_id} did not end: {out}")


def in_process(models: Path, x: np.ndarray) -> np.ndarray:
    """The model the fleet serves, loaded here and run over `x` at once."""
    import tensorflow as tf

    serve = tf.saved_model.load(str(models / "faulty" / "1")).signatures["serving_default"]
    return np.asarray(serve(x=tf.constant(x))["y"])


def assert_whole(
    store: ObjectStore,
    models: Path,
    done: dict[str, Any],
    rows: list[ShardRow],
    *,
    finished_before: set[str],
) -> None:
    """Every record's output once, the model's own, and the shards finished before the fault
    run once."""
    assert done["status"] == "succeeded", done
    assert done["counts"] == {"records": RECORDS, "succeeded": RECORDS, "failed": 0}, done
    assert done["shards"] | {"running": 0} == {
        "total": SHARDS, "done": SHARDS, "failed": 0, "running": 0,
    }, done  # fmt: skip

    prefix = f"{DEFAULT_TENANT}/transforms/{done['id']}/"
    names = sorted(store.keys(prefix))
    assert names == [f"{prefix}part-{k:05d}.parquet" for k in range(SHARDS)], names
    got = pa.concat_tables(pq.read_table(io.BytesIO(bytes(store.get(n)))) for n in names)

    source = pq.read_table(io.BytesIO(bytes(store.get(f"{DEFAULT_TENANT}/datasets/{DATASET}"))))
    keys = source.column("id").to_pylist()
    seen = Counter(got.column("id").to_pylist())
    assert set(seen) == set(keys), f"missing: {sorted(set(keys) - set(seen))[:5]}"
    assert [k for k, n in seen.items() if n > 1] == [], "records written twice"
    assert got.column("id").to_pylist() == keys, "input order"
    x = np.array(source.column("x").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(
        np.array(got.column("y").to_pylist()), in_process(models, x), rtol=1e-5, atol=1e-5
    )

    assert [row.status for row in rows] == ["succeeded"] * SHARDS, rows
    assert finished_before, "no shard had finished before the fault"
    for row in rows:
        if row.id in finished_before:
            assert (row.attempts, row.history) == (1, ["started"]), f"run again: {row}"


# (1) A child killed mid-shard


@pytest.mark.parametrize("object_store_url", ["s3"], indirect=True)
def test_a_child_killed_mid_shard_reruns_that_shard_alone_and_loses_nothing(
    make_fleet: Callable[..., Fleet], shards: Shards, object_store: ObjectStore, tmp_path: Path
) -> None:
    fleet = make_fleet()
    put_dataset(object_store)
    transform_id = submit(fleet, shards)

    for _ in range(3):  # a kill that lands as its shard completes is tried on the next shard
        fleet.wait_until(lambda: shards.mid_shard() is not None, "a shard mid-run", 60)
        victim = shards.mid_shard()
        assert victim is not None
        finished_before = shards.succeeded()
        os.kill(victim.pid, signal.SIGKILL)

        def released(victim: ShardRow = victim) -> bool:
            row = shards.row(victim.id)
            return row.status != "running" or row.lease_owner != victim.lease_owner

        fleet.wait_until(released, "the killed child's shard let go", 30)
        if "requeued" in shards.row(victim.id).history:
            break  # it died holding the shard
    else:
        pytest.fail("no kill landed mid-shard")

    done = wait_end(fleet, transform_id)
    rows = shards.rows()
    assert_whole(object_store, tmp_path / "models", done, rows, finished_before=finished_before)
    rerun = next(row for row in rows if row.id == victim.id)
    assert (rerun.attempts, rerun.history) == (2, ["started", "requeued", "started"]), rerun
    assert all(row.attempts == 1 for row in rows if row.id != victim.id), rows


# (2) The API restarted mid-transform


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_the_api_restarted_mid_transform_answers_the_wait_after_and_the_transform_ends(
    make_fleet: Callable[..., Fleet], shards: Shards, object_store: ObjectStore, tmp_path: Path
) -> None:
    fleet = make_fleet()
    put_dataset(object_store)
    transform_id = submit(fleet, shards)
    fleet.wait_until(lambda: shards.mid_shard() is not None, "a shard mid-run", 60)
    finished_before = shards.succeeded()

    # A long-poll in flight when the API dies ends with a transport error, not a hang.
    cut: list[BaseException] = []

    def long_poll() -> None:
        try:
            with fleet.http(timeout=60) as client:
                client.get(f"/v1/transforms/{transform_id}?wait=60")
        except httpx.TransportError as exc:
            cut.append(exc)

    poller = threading.Thread(target=long_poll)
    poller.start()
    fleet.stop("api", sig=signal.SIGKILL)
    poller.join()
    assert cut, "the wait in flight outlived its API"

    # The worker goes on without the API: another shard ends while it is down.
    fleet.wait_until(lambda: len(shards.succeeded()) > len(finished_before), "a shard", 60)
    assert len(shards.succeeded()) < SHARDS, "the transform ended before the API was back"
    fleet.start_api()

    done = wait_end(fleet, transform_id)
    rows = shards.rows()
    assert_whole(object_store, tmp_path / "models", done, rows, finished_before=finished_before)
    assert all(row.attempts == 1 for row in rows), rows


# (3) Redis restarted mid-transform


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_redis_restarted_mid_transform_loses_no_shard_and_runs_none_twice(
    make_fleet: Callable[..., Fleet],
    private_redis: PrivateRedis,
    shards: Shards,
    object_store: ObjectStore,
    tmp_path: Path,
) -> None:
    fleet = make_fleet(broker_url=private_redis.url)
    put_dataset(object_store)
    transform_id = submit(fleet, shards)
    fleet.wait_until(lambda: shards.mid_shard() is not None, "a shard mid-run", 60)
    finished_before = shards.succeeded()

    private_redis.restart()  # no AOF, no snapshot: every wake-up and unacked message is gone

    done = wait_end(fleet, transform_id)
    rows = shards.rows()
    assert_whole(object_store, tmp_path / "models", done, rows, finished_before=finished_before)
    assert all(row.attempts == 1 for row in rows), rows
