"""The fake fleet the client and CLI tests run against: two models (`SIGNATURES`, `fake_model`),
`FakeWorker`, which plays a worker through `db.jobs` and announces on the completion channel, and
`tffleet api` served in a subprocess (`served`, with `worker` playing its worker).

`served` and `worker` are fixtures; tests/client/conftest.py and tests/cli/conftest.py take them in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis
from sqlalchemy import select

from db import jobs, registry, tenants
from db.engine import make_engine, make_sessionmaker
from db.models import DEFAULT_TENANT, Job, JobErrorCode
from tffleet import Retries, tensors
from tffleet.cli.process_group import free_port
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.objectstore import ObjectStore, open_store

NO_WAIT = Retries(backoff_s=0)  # retries without back-off, for tests

# The fake fleet: name -> (inputs, outputs) of version 1.
SIGNATURES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "double": (
        {"x": {"dtype": "float32", "shape": [-1, 4]}},
        {
            "y": {"dtype": "float32", "shape": [-1, 4]},
            "argmax": {"dtype": "int64", "shape": [-1]},
        },
    ),
    "pair": (
        {"a": {"dtype": "float32", "shape": [-1, 3]}, "b": {"dtype": "int32", "shape": [-1, 2]}},
        {"total": {"dtype": "float64", "shape": [-1]}},
    ),
}


def fake_model(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if "x" in inputs:
        x = inputs["x"]
        return {"y": x * 2, "argmax": x.argmax(axis=1).astype(np.int64)}
    return {"total": inputs["a"].sum(axis=1, dtype=np.float64) + inputs["b"].sum(axis=1)}


def samples(n: int) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 7


# Playing the worker


def register_models(database_url: str) -> str:
    """Register the fake fleet's models; returns a new admin key of the `default` tenant."""
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
        for name, (inputs, outputs) in SIGNATURES.items():
            registry.register(
                session=session,
                name=name,
                version=1,
                format="savedmodel",
                inputs=inputs,
                outputs=outputs,
            )
    engine.dispose()
    return key


class FakeWorker:
    """Claims queued jobs, runs `fake_model` (or fails them), writes the results through db.jobs
    as a worker does, and announces them on the completion channel so long-polls wake."""

    def __init__(self, database_url: str, redis_url: str, store: ObjectStore | None = None) -> None:
        self._store = store  # where inputs given by reference are read from
        self._engine = make_engine(database_url)
        self._sessions = make_sessionmaker(self._engine)
        self._redis = redis.Redis.from_url(redis_url)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def finish(self, job_ids: Sequence[str], *, fail: str | None = None) -> list[str]:
        with self._sessions.begin() as session:
            leases = jobs.claim(session=session, job_ids=list(job_ids), owner="fake", lease_s=60)
        if not leases:
            return []
        with self._sessions.begin() as session:
            if fail is not None:
                jobs.fail(
                    session=session, leases=leases, code=JobErrorCode.MODEL_ERROR, message=fail
                )
            else:
                results = [
                    (lease, tensors.pack(fake_model(self._inputs(lease.inputs))))
                    for lease in leases
                ]
                jobs.complete(session=session, results=results)
        ids = [lease.job_id for lease in leases]
        self._redis.publish(JOBS_DONE_CHANNEL, orjson.dumps(ids))
        return ids

    def _inputs(self, blob: bytes) -> dict[str, np.ndarray]:
        """A job's inputs, those it holds by reference read from the store, as a worker does."""
        wanted = tensors.references(blob).values()
        if wanted and self._store is None:
            raise AssertionError("a job with inputs in the object store; FakeWorker has none")
        objects = {ref.key: self._store.get(ref.key) for ref in wanted} if self._store else {}
        return tensors.unpack(blob, objects)

    def queued(self, model: str) -> list[str]:
        with self._sessions() as session:
            query = (
                select(Job.id).where(Job.model == model, Job.status == "queued").order_by(Job.id)
            )
            return list(session.scalars(query))

    def serve(self, model: str, *, delay_s: float = 0.05, fail: str | None = None) -> None:
        """From a thread: finish every queued job of `model`, each some `delay_s` after it came."""

        def run() -> None:
            try:
                while not self._stop.wait(delay_s):
                    if ids := self.queued(model):
                        self.finish(ids, fail=fail)
            except BaseException as exc:  # surfaced in the test by close()
                self.errors.append(exc)

        thread = threading.Thread(target=run, name=f"fake-worker-{model}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._redis.close()
        self._engine.dispose()
        if self.errors:
            raise self.errors[0]


# `tffleet api` in a subprocess, for the blocking client and the CLI


@dataclass
class Served:
    url: str
    database_url: str
    redis_url: str
    api_key: str  # an admin's
    object_store: str  # its TFFLEET_OBJECT_STORE, a directory of its own


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, redis_server: str, sqlite_template: Path
) -> Iterator[Served]:
    """`tffleet api` on a free port, on its own SQLite file and object store directory and the
    test run's Redis database."""
    path = tmp_path_factory.mktemp("served")
    shutil.copyfile(sqlite_template, path / "tffleet.db")  # migrated (tests/conftest.py)
    database_url = f"sqlite:///{path / 'tffleet.db'}"
    api_key = register_models(database_url)
    port = free_port()
    env = {
        **os.environ,
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": redis_server,
        "TFFLEET_API_PORT": str(port),
        "TFFLEET_OBJECT_STORE": (path / "objects").as_uri(),
    }
    with (path / "api.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "api"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tffleet api did not start:\n{(path / 'api.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield Served(url, database_url, redis_server, api_key, env["TFFLEET_OBJECT_STORE"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def worker(served: Served) -> Iterator[FakeWorker]:
    fake = FakeWorker(served.database_url, served.redis_url, open_store(served.object_store))
    yield fake
    fake.close()
