"""End to end: a real worker reads a job's inputs from the object store and writes its large
outputs there (issue 26), with real processes, a directory store and real TensorFlow.

The jobs whose inputs are references are stored as the API stores them (their object put in
the store as an upload, a packed reference in the row) and woken by a publish, so the test leans
on the worker alone; a job submitted over HTTP shows how the API gives a stored output.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from db import jobs, tenants
from db.engine import make_engine, make_sessionmaker
from db.models import DEFAULT_TENANT
from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp
from tffleet import tensors
from tffleet.broker import Publisher, make_celery
from tffleet.objectstore import ObjectStore, keys, open_store
from tffleet.settings import Settings
from tffleet.tensors import Reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# The mlp's output is 3 float32 a sample: a job of 6 samples or more writes it to the store.
INLINE_MAX_BYTES = 64
BIG_JOB = 150_001  # samples of the big .npy job body below (8 float32 each: 4.8 MB)


@pytest.fixture
def fleet(
    fleet_factory: Callable[..., Fleet], sqlite_url: str, object_store_url: str, tmp_path: Path
) -> Iterator[tuple[Fleet, Any]]:
    """An API and a worker (one CPU child) over the test's store, TFFLEET_OBJECT_STORE in the
    environment they inherit (`object_store_url`), and the mlp they serve."""
    model = build_mlp(tmp_path / "models")
    fleet = fleet_factory(
        sqlite_url,
        tmp_path / "models",
        devices="cpu:1",
        extra_env={
            "TFFLEET_INLINE_MAX_BYTES": str(INLINE_MAX_BYTES),
            "TFFLEET_TENANT_MAX_SAMPLES_PER_JOB": str(BIG_JOB),
        },
    )
    fleet.start_api()
    fleet.start_worker()
    yield fleet, model


def upload(store: ObjectStore, x: np.ndarray) -> Reference:
    """`x` put in the store as POST /v1/uploads puts it: a whole .npy under the tenant's uploads."""
    key = keys.upload_key(DEFAULT_TENANT, keys.new_upload_id())
    data = tensors.write_npy(x)
    store.put(key, data)
    return Reference(key, x.dtype.name, tuple(x.shape), len(data) - x.nbytes, x.nbytes)


def store_job(fleet: Fleet, ref: Reference) -> str:
    """A queued job of the mlp whose input `x` is the reference, as the API stores one."""
    engine = make_engine(fleet.database_url)
    try:
        with make_sessionmaker(engine).begin() as session:
            tenants.ensure_tenant(session=session, name=DEFAULT_TENANT)
            (row,) = jobs.create(
                session=session,
                jobs=[
                    jobs.NewJob(
                        model="mlp",
                        version=1,
                        samples=ref.shape[0],
                        inputs=tensors.pack({}, {"x": ref}),
                    )
                ],
            )
            return str(row.id)
    finally:
        engine.dispose()


def wake(fleet: Fleet, job_ids: list[str]) -> None:
    publisher = Publisher(make_celery(Settings(broker_url=fleet.broker_url)))
    assert publisher.publish(model="mlp", version=1, job_ids=job_ids)


def stored_bytes(fleet: Fleet, job_id: str) -> int | None:
    engine = make_engine(fleet.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return jobs.get(session=session, job_id=job_id).stored_bytes
    finally:
        engine.dispose()


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_a_job_reads_its_inputs_from_the_store_and_writes_its_large_outputs_there(
    fleet: tuple[Fleet, Any], object_store_url: str
) -> None:
    running, model = fleet
    store = open_store(object_store_url)
    rng = np.random.default_rng(3)
    x, y = (rng.normal(size=(n, 8)).astype(np.float32) for n in (10, 2))
    by_ref = store_job(running, upload(store, x))
    gone_ref = upload(store, y)
    gone = store_job(running, gone_ref)
    store.delete([gone_ref.key])  # its upload was deleted after the job was stored

    wake(running, [by_ref, gone])
    done, failed = running.wait_ended(by_ref), running.wait_ended(gone)

    assert done["status"] == "succeeded", done
    (name,) = done["outputs"]
    # 10 x 3 float32, over the limit: in the store, and the job's JSON says where.
    assert done["outputs"][name] == {
        "uri": f"tffleet://jobs/{by_ref}/outputs/{name}",
        "dtype": "float32",
        "shape": [10, 3],
    }
    data = store.get(keys.output_key(DEFAULT_TENANT, by_ref, name))
    np.testing.assert_allclose(np.load(io.BytesIO(data)), model(x), rtol=1e-5, atol=1e-6)
    assert stored_bytes(running, by_ref) == len(data)
    assert (failed["status"], failed["error"]["code"], failed["attempts"]) == (
        "failed", "input_missing", 1,
    )  # fmt: skip
    assert "'x'" in failed["error"]["message"] and "deleted" in failed["error"]["message"]

    # Submitted over HTTP with its inputs inline: its outputs too large for a row all the same.
    z = rng.normal(size=(8, 8)).astype(np.float32)
    with running.http(timeout=60) as client:
        answer = client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": z.tolist()}})
    assert answer.status_code == 202, answer.text
    job = running.wait_ended(answer.json()["id"])
    assert job["status"] == "succeeded" and job["outputs"][name]["shape"] == [8, 3], job
    data = store.get(keys.output_key(DEFAULT_TENANT, job["id"], name))
    np.testing.assert_allclose(np.load(io.BytesIO(data)), model(z), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
def test_big_npy_bodies_reach_the_store_byte_for_byte_over_one_connection(
    fleet: tuple[Fleet, Any], object_store_url: str
) -> None:
    """`tffleet api` reads a big .npy body straight into the store's direct buffers
    (api/httpserver.py `BodyReader`): an upload and a job's body, one after the other on one
    kept-alive connection, then a small JSON job on it, each what was sent."""
    running, model = fleet
    store = open_store(object_store_url)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(200_003, 8)).astype(np.float32)  # 6.4 MB: past a direct buffer or two
    y = rng.normal(size=(BIG_JOB, 8)).astype(np.float32)
    npy = {"Content-Type": tensors.NPY}
    with running.http(timeout=120) as client:
        uploaded = client.post("/v1/uploads", content=tensors.write_npy(x), headers=npy)
        assert uploaded.status_code == 201, uploaded.text
        upload_id = uploaded.json()["uri"].rsplit("/", 1)[1]
        assert bytes(store.get(keys.upload_key(DEFAULT_TENANT, upload_id))) == tensors.write_npy(x)

        body = client.post("/v1/jobs?model=mlp", content=tensors.write_npy(y), headers=npy)
        assert body.status_code == 202, body.text
        small = client.post("/v1/jobs", json={"model": "mlp", "inputs": {"x": [[0.5] * 8]}})
        assert small.status_code == 202, small.text
    job = running.wait_ended(body.json()["id"])
    assert job["status"] == "succeeded", job
    (name,) = job["outputs"]
    data = store.get(keys.output_key(DEFAULT_TENANT, job["id"], name))
    np.testing.assert_allclose(np.load(io.BytesIO(data)), model(y), rtol=1e-5, atol=1e-6)
    assert running.wait_ended(small.json()["id"])["status"] == "succeeded"
