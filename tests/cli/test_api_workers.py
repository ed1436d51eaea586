"""`tffleet api --workers 2`: /metrics reports every process's counters, summed, whichever
process answers, and the autoscaling gauges once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import multiprocess
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from db import registry, tenants
from db.models import DEFAULT_TENANT
from tffleet.cli.process_group import free_port

pytestmark = pytest.mark.slow

MODEL = "multi"
BODY = {"model": MODEL, "inputs": [[1.0, 2.0, 3.0, 4.0]]}


class Api:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, key: str, log: Path) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.log = log

    def submit(self) -> int:
        # A connection per request, so that both processes accept some.
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as client:
            response = client.post("/v1/jobs", json=BODY, headers={"Connection": "close"})
        assert response.status_code == 202, response.text
        return 1

    def metrics(self) -> str:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30) as client:
            response = client.get("/metrics", headers={"Connection": "close"})
        assert response.status_code == 200, response.text
        return response.text


@pytest.fixture
def tmpdir_of_api(tmp_path: Path) -> Path:
    """TMPDIR of the API processes: where `tffleet api` makes its metrics directory."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


@pytest.fixture
def api(
    sessions: sessionmaker[Session],
    db_url: str,
    redis_url: str,
    tmp_path: Path,
    tmpdir_of_api: Path,
) -> Iterator[Api]:
    with sessions.begin() as session:
        registry.register(
            session=session,
            name=MODEL,
            version=1,
            format="savedmodel",
            inputs={"x": {"dtype": "float32", "shape": [-1, 4]}},
            outputs={"y": {"dtype": "float32", "shape": [-1]}},
        )
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
    port = free_port()
    env = {
        **os.environ,
        "TFFLEET_DATABASE_URL": db_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TMPDIR": str(tmpdir_of_api),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp_path / "api.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "api", "--workers", "2", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    running = Api(proc, port, key, log)
    try:
        deadline = time.monotonic() + 90
        while not ready(running):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tffleet api did not get ready:\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
        yield running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def ready(api: Api) -> bool:
    try:
        return httpx.get(f"{api.url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def submitted_by_process(metrics_dir: Path) -> dict[str, float]:
    """tffleet_jobs_submitted_total of MODEL in each process's file: {file name: count}."""
    counts = {}
    for path in sorted(metrics_dir.glob("counter_*.db")):
        for family in multiprocess.MultiProcessCollector.merge([str(path)]):
            for sample in family.samples:
                if (
                    sample.name == "tffleet_jobs_submitted_total"
                    and sample.labels.get("model") == MODEL
                ):
                    counts[path.name] = sample.value
    return counts


def samples_of(text: str, name: str) -> list[float]:
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("model") == MODEL
    ]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_metrics_sum_the_counters_of_every_api_process(api: Api, tmpdir_of_api: Path) -> None:
    (metrics_dir,) = tmpdir_of_api.glob("tffleet-api-metrics-*")
    submitted = 0
    with ThreadPoolExecutor(8) as pool:
        for _ in range(40):  # rounds, until both processes have taken some
            submitted += sum(pool.map(lambda _: api.submit(), range(8)))
            if len([n for n in submitted_by_process(metrics_dir).values() if n > 0]) == 2:
                break
    by_process = submitted_by_process(metrics_dir)
    assert len([n for n in by_process.values() if n > 0]) == 2, by_process

    for _ in range(6):  # whichever process answers
        text = api.metrics()
        assert samples_of(text, "tffleet_jobs_submitted_total") == [submitted]
        # The autoscaling gauges come from the database, once: not per process.
        assert samples_of(text, "tffleet_jobs_queued") == [submitted]

    os.killpg(api.proc.pid, signal.SIGTERM)
    assert api.proc.wait(timeout=30) == 0
    assert not metrics_dir.exists()  # removed at exit
