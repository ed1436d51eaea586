"""Bad input, tried wide: schemathesis on the app's own OpenAPI schema, and hypothesis on the
bodies of `POST /v1/jobs`.

Property tests run many requests from synchronous code, so the API here is a real `tffleet api`
process (on SQLite: the request path is the same on either database) driven over HTTP, not the
in-process app: that needs an event loop per call. The fake fleet's signatures are registered
(`models`) before it starts; no worker runs, so a job accepted stays `queued`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from db import tenants
from db.models import DEFAULT_TENANT
from tests.api.conftest import (
    MAX_BODY_BYTES,
    Sessions,
    assert_nothing_left,
    count_jobs,
)
from tests.api.strategies import bad_requests, valid_jobs
from tffleet.cli.process_group import free_port

pytestmark = pytest.mark.slow

# What an invalid submission may be answered with (docs/how-to/http-api.md, Errors): never 202,
# never 5xx.
REJECTED = {400, 401, 413, 415, 422}

# Bounded so that the file runs in well under two minutes.
EXAMPLES_PER_OPERATION = 50
INVALID_BODIES = 600
VALID_BODIES = 40


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: the API's code path is the same on PostgreSQL, and this is much faster."""
    return sqlite_url


@dataclass
class ApiProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    headers: dict[str, str]  # an admin key's

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, (
            f"the API exited ({self.proc.returncode}):\n{self.output()}"
        )
        response = httpx.get(f"{self.url}/healthz", timeout=10)
        assert response.status_code == 200, response.text
        assert response.json() == {"status": "ok"}


@pytest.fixture
def api_process(
    db_url: str, redis_url: str, models: dict[str, Any], sessions: Sessions, tmp_path: Path
) -> Iterator[ApiProcess]:
    port = free_port()
    log = tmp_path / "api.log"
    env = {
        **os.environ,
        "TFFLEET_DATABASE_URL": db_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_API_PORT": str(port),
        "TFFLEET_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "api", "--log-level", "WARNING"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    with sessions.begin() as session:
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
    headers = {"Authorization": f"Bearer {key}"}
    running = ApiProcess(url=f"http://127.0.0.1:{port}", proc=proc, log=log, headers=headers)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the API exited ({proc.returncode}):\n{running.output()}"
            try:
                if httpx.get(f"{running.url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the API never got ready:\n{running.output()}"
            time.sleep(0.1)
        yield running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def http(api_process: ApiProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_process.url, timeout=30, headers=api_process.headers) as client:
        yield client


# 1. schemathesis: every operation of the app's own schema


def test_every_operation_answers_within_its_schema(
    api_process: ApiProcess, sessions: Sessions
) -> None:
    schema = schemathesis.openapi.from_url(f"{api_process.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {operation.label for operation in operations}
    assert {"POST /v1/jobs", "GET /v1/jobs/{job_id}", "POST /v1/jobs/status"} <= labels

    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            _fuzz_operation(operation, mode, api_process.url, api_process.headers)
    api_process.assert_alive()
    # No worker runs: whatever was accepted is still there, and never more than was sent.
    assert count_jobs(sessions) <= 2 * EXAMPLES_PER_OPERATION


def _fuzz_operation(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    url: str,
    headers: dict[str, str],
) -> None:
    checks = [not_a_server_error, status_code_conformance, content_type_conformance]
    if mode is schemathesis.GenerationMode.POSITIVE:
        checks.append(response_schema_conformance)

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        if isinstance(case.query, dict) and "wait" in case.query:
            case.query["wait"] = 0  # a long-poll on a job that exists would hold 30 s
        response = case.call(base_url=url, timeout=30, headers=headers)
        case.validate_response(response, checks=checks)

    try:
        run()
    except Unsatisfiable:
        # Nothing to get wrong: every string is a valid `job_id`, and some operations take nothing.
        if mode is not schemathesis.GenerationMode.NEGATIVE:
            raise


# 2. hypothesis: malformed tensors and bodies for POST /v1/jobs (tests/api/strategies.py)


def _post(
    http: httpx.Client, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    sent = {"Content-Type": content_type} if content_type else {}
    return http.post("/v1/jobs", content=body, headers={**sent, **(headers or {})})


def test_invalid_submissions_are_refused_and_leave_nothing(
    api_process: ApiProcess, http: httpx.Client, sessions: Sessions, broker: redis.Redis
) -> None:
    seen: set[int] = set()

    @settings(
        max_examples=INVALID_BODIES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=bad_requests())
    def run(request: tuple[bytes, str, dict[str, str]]) -> None:
        body, content_type, headers = request
        response = _post(http, body, content_type, headers)
        assert response.status_code in REJECTED, (response.status_code, response.text, body[:300])
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["code"] and error["message"]
        seen.add(response.status_code)

    run()
    assert seen == REJECTED  # every kind of refusal was exercised
    assert_nothing_left(sessions, broker)
    api_process.assert_alive()


def test_valid_random_inputs_are_accepted(
    api_process: ApiProcess, http: httpx.Client, sessions: Sessions
) -> None:
    accepted: list[str] = []

    @settings(
        max_examples=VALID_BODIES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(job=valid_jobs())
    def run(job: tuple[bytes, int]) -> None:
        body, _rows = job
        response = _post(http, body, "application/json")
        assert response.status_code == 202, (response.text, body[:300])
        out = response.json()
        assert out["model"] == "mlp"
        assert out["status"] == "queued"
        accepted.append(out["id"])

    run()
    assert len(set(accepted)) == len(accepted)
    assert count_jobs(sessions) == len(accepted)
    api_process.assert_alive()
