"""A worker host whose wall clock is 5 minutes off, slow or fast, beside an API host and a
sweeper host whose clocks are right (tests/e2e/hosts.py; libfaketime shifts the skewed host's
realtime clock and leaves its monotonic clock alone, as on a real host; hosts.SLEEP_SHIM and
`build_busy` below work around what libfaketime gets wrong).

Time is the database's (docs/explanation/guarantees.md): leases, heartbeats and presence are
written in the database's time, whatever the host's clock says. So with leases of 6 s, a sweep
every second and a report every second, a skew of minutes would show at once:

- slow: each lease would be born expired, and the sweeper would take every job back while it
  runs (attempts climb, results are fenced out, jobs end `worker_lost`); the host's presence
  rows would look minutes old, its children dead;
- fast: each lease would outlive a dead host by 5 minutes; its presence rows would come from
  the future.

Every job must instead end `succeeded` once (attempts == 1, every result written), no lease is
taken back, the leases run `TFFLEET_LEASE_S` ahead of the database's clock, and the host's
children are live: recent presence rows by the database's clock, listed by GET /v1/models.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from db.presence import LIVE_POLLS
from tests.e2e.hosts import Cluster, JobsTable, open_cluster
from tffleet import tensors

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LEASE_S = 6.0
POLL_S = 1.0
FAST_CLOCKS = {
    "TFFLEET_LEASE_S": f"{LEASE_S:g}",
    "TFFLEET_SWEEP_INTERVAL_S": "1",
    "TFFLEET_MODEL_POLL_S": f"{POLL_S:g}",
    "TFFLEET_REPUBLISH_AFTER_S": "3",
    "TFFLEET_MAX_ATTEMPTS": "3",
}
SKEW_S = {"-5m": -300.0, "+5m": 300.0}
LONG_S = LEASE_S + 2  # a forward pass that outlives a lease: only heartbeats keep it
CHILD_LOADED = re.compile(r"child \S+ \(pid (\d+), CUDA_VISIBLE_DEVICES=\S+\) loaded")
BATCH_DONE = re.compile(
    r"'claimed': (\d+), 'succeeded': (\d+), 'failed': (\d+), .*'written': (\d+)"
)
SWEEP = re.compile(r"sweep: requeued (\d+), worker_lost (\d+)")


BUSY_COLUMN = 0  # the forward pass runs for the largest value in this column, in seconds


def build_busy(repository: Path, *, name: str = "busy", version: int = 1) -> np.ndarray:
    """y = x @ W for x of 4 floats; the forward pass spins (by `tf.timestamp`) for
    max(x[:, BUSY_COLUMN]) seconds, holding its child and a CPU. Returns W.

    Not a sleep, as models.build_faulty does: TensorFlow sleeps and timed waits until a deadline
    on the kernel's realtime clock, which libfaketime does not shift, so on a host 5 minutes fast
    a sleep of 0 s lasts 5 minutes, and 5 minutes slow every sleep ends at once. Differences of
    `tf.timestamp` are right on either host.
    """
    import tensorflow as tf

    weights = np.arange(8, dtype=np.float32).reshape(4, 2) - 3.5

    class Busy(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            column = tf.concat([x[:, BUSY_COLUMN], [0.0]], axis=0)
            seconds = tf.cast(tf.reduce_max(column), tf.float64)
            start = tf.timestamp()

            def busy(spins: tf.Tensor) -> tf.Tensor:
                with tf.control_dependencies([spins]):
                    return tf.timestamp() - start < seconds

            (spins,) = tf.while_loop(busy, lambda n: (n + 1,), (tf.constant(0, tf.int64),))
            with tf.control_dependencies([spins]):
                return {"y": tf.matmul(tf.identity(x), self.w)}

    module = Busy()
    tf.saved_model.save(
        module, str(repository / name / str(version)), signatures={"serving_default": module.serve}
    )
    return weights


@pytest.fixture
def weights(tmp_path: Path) -> np.ndarray:
    return build_busy(tmp_path / "models")


@pytest.fixture
def cluster(tmp_path: Path, weights: np.ndarray) -> Iterator[Cluster]:
    with open_cluster(tmp_path, tmp_path / "models", env=FAST_CLOCKS) as made:
        yield made


@pytest.fixture
def table(cluster: Cluster) -> Iterator[JobsTable]:
    opened = JobsTable(cluster.database_url)
    yield opened
    opened.close()


def inputs(n: int, *, seed: int, busy_s: float) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = []
    for _ in range(n):
        x = rng.normal(size=(int(rng.integers(1, 4)), 4)).astype(np.float32)
        x[:, BUSY_COLUMN] = busy_s
        xs.append(x)
    return xs


def leases_left(table: JobsTable) -> list[tuple[str, int, float]]:
    """(id, attempts, seconds its lease runs past the database's clock) of each running job."""
    with table.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, attempts, EXTRACT(EPOCH FROM lease_expires_at - "
                "(clock_timestamp() AT TIME ZONE 'UTC')) AS left_s "
                "FROM jobs WHERE status = 'running'"
            )
        )
        return [(row.id, int(row.attempts), float(row.left_s)) for row in rows]


@pytest.mark.parametrize("offset", ["-5m", "+5m"], ids=["slow", "fast"])
def test_a_worker_host_minutes_off_the_database_clock_runs_every_job_once_and_counts_as_live(
    cluster: Cluster, table: JobsTable, weights: np.ndarray, offset: str
) -> None:
    api, sweeper = cluster.add_host("api"), cluster.add_host("sweeper")
    skewed = cluster.add_host("skewed", clock=offset)

    # The skew is real on that host (and only there), and time.monotonic() is untouched.
    before = time.time()
    there = float(cluster.python(skewed, "import time; time.sleep(0.01); print(time.time())"))
    here = float(cluster.python(api, "import time; print(time.time())"))
    assert abs(there - before - SKEW_S[offset]) < 30, (offset, there - before)
    assert abs(here - time.time()) < 30, here - time.time()

    cluster.start_api(api)
    cluster.start_sweeper(sweeper)
    cluster.start_worker(skewed, "cpu:2")
    # Loaded, by its own log (whatever the database makes of its reports).
    cluster.wait_until(
        lambda: len(CHILD_LOADED.findall(skewed.log("worker"))) >= 2,
        "the skewed host's 2 children loaded",
        180,
    )
    pids = {int(pid) for pid in CHILD_LOADED.findall(skewed.log("worker"))}
    for pid in pids:
        assert "libfaketime" in Path(f"/proc/{pid}/maps").read_text(), f"child {pid} not skewed"

    problems: list[str] = []

    # Live: its presence rows are recent by the database's clock, and the API lists them.
    _check_live(cluster, skewed.identity, pids, problems, when="once loaded")

    # Jobs: a batch that runs longer than a lease (held by heartbeats), and many short ones.
    long = inputs(2, seed=1, busy_s=LONG_S)
    short = inputs(60, seed=2, busy_s=0.05)
    expected: dict[str, np.ndarray] = {}
    with cluster.http(timeout=60) as client:
        for xs in (long, short):
            body = {"jobs": [{"model": "busy", "inputs": {"x": x.tolist()}} for x in xs]}
            r = client.post("/v1/jobs", json=body)
            assert r.status_code == 202, r.text
            expected.update(zip([job["id"] for job in r.json()["jobs"]], xs, strict=True))
    long_ids = list(expected)[:2]

    # While they run: each lease runs TFFLEET_LEASE_S ahead of the database's clock (no more,
    # no less), and none is taken back.
    horizons: list[float] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        rows = table.rows("id = ANY(:ids)", ids=long_ids)
        if all(row.status not in ("queued", "running") for row in rows.values()):
            break
        horizons += [left for _, _, left in leases_left(table)]
        time.sleep(0.3)
    if horizons and not all(0 < left <= LEASE_S + 1 for left in horizons):
        problems.append(
            f"leases: running jobs' leases ran {min(horizons):.1f}s to {max(horizons):.1f}s past "
            f"the database's clock (want 0 to {LEASE_S + 1:g}s)"
        )
    if not horizons:
        problems.append("leases: no running job seen while the long jobs ran")

    rows = table.drain(list(expected), timeout_s=90)
    db_now = table.now()
    attempts = {i: rows[i].attempts for i in expected if rows[i].attempts != 1}
    if attempts:
        problems.append(
            f"attempts: {len(attempts)} jobs were claimed more than once: {_head(attempts)}"
        )
    not_done = {
        i: (rows[i].status, rows[i].error_code) for i in expected if rows[i].status != "succeeded"
    }
    if not_done:
        problems.append(f"status: {len(not_done)} jobs did not succeed: {_head(not_done)}")
    requeued = sum(int(a) + int(b) for a, b in SWEEP.findall(sweeper.log("sweeper")))
    if requeued:
        problems.append(f"sweeper: took back {requeued} leases while the worker ran them")
    fenced = [b for b in BATCH_DONE.findall(skewed.log("worker")) if b[3] != b[0]]
    if fenced:
        problems.append(
            f"worker: {len(fenced)} batches had results fenced out (claimed, written): {fenced[:5]}"
        )
    # Its timestamps are the database's: after the submit, before now.
    slip = 1.0
    order = {
        i: (str(r.created_at), str(r.started_at), str(r.finished_at))
        for i, r in rows.items()
        if i in expected
        and r.started_at is not None
        and not (
            (r.started_at - r.created_at).total_seconds() > -slip
            and r.finished_at >= r.started_at
            and (r.finished_at - db_now).total_seconds() < slip
        )
    }
    if order:
        problems.append(
            f"timestamps: {len(order)} jobs started before they were created or finished in the "
            f"future, by the database's clock (created, started, finished): {_head(order)}"
        )
    _check_live(cluster, skewed.identity, pids, problems, when="after the jobs")

    assert not problems, f"worker host clock {offset} off:\n- " + "\n- ".join(problems)

    for job_id, x in expected.items():
        np.testing.assert_allclose(
            tensors.unpack(rows[job_id].outputs)["y"], x @ weights, rtol=1e-5, atol=1e-5
        )
        assert cluster.host_of(rows[job_id].worker) == "skewed"


def _check_live(
    cluster: Cluster, identity: str, pids: set[int], problems: list[str], *, when: str
) -> None:
    """The skewed host's children count as live: each has a presence row that is recent by the
    database's clock (the freshest of a few reports), and GET /v1/models lists them."""
    live_window = LIVE_POLLS * POLL_S
    ages: dict[str, float] = {}  # child -> the age nearest 0 seen
    listed = 0
    deadline = time.monotonic() + 4 * POLL_S
    while time.monotonic() < deadline:
        for row in cluster.presence():
            if row.host == identity and int(row.pid) in pids:
                age = float(row.age_s)
                ages[row.child] = min(age, ages.get(row.child, age), key=abs)
        with cluster.http(timeout=10) as client:
            models = client.get("/v1/models").json()["models"]
        workers = [w for m in models if m["name"] == "busy" for w in m["workers"]]
        listed = max(listed, sum(1 for w in workers if w["host"] == identity))
        time.sleep(POLL_S / 4)
    if len(ages) < len(pids) or not all(-1.0 <= age <= live_window for age in ages.values()):
        shown = ", ".join(f"{age:.1f}s" for age in ages.values())
        problems.append(
            f"presence {when}: the skewed host's {len(pids)} children have "
            + (f"rows {shown} old" if ages else "no rows (purged as dead)")
            + f" by the database's clock (live: 0 to {live_window:g}s old)"
        )
    if listed != len(pids):
        problems.append(
            f"GET /v1/models {when}: lists {listed} of the skewed host's {len(pids)} children as "
            "live workers"
        )


def _head(found: dict[str, Any], n: int = 5) -> dict[str, Any]:
    return dict(list(found.items())[:n])
