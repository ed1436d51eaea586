"""Bad requests against a fleet under load: none answered 5xx, none stores anything.

Tenant `load` keeps the fleet busy with valid jobs (submit and wait, from a thread) while tenant
`fuzz` sends the generated bad submissions of tests/api/strategies.py (malformed JSON and
tensors, lying envelopes, wrong content types and keys, missing or made-up API keys) and reads
and cancels `load`'s jobs by id (404: another tenant's). At the end `fuzz` owns no job and every
`load` job succeeded.

The suite sends 2,000 (60% submissions, 40% reads); `TFFLEET_BAD_REQUESTS=10000 .venv/bin/python
-m pytest -s tests/e2e/test_bad_requests.py` sends the 10,000 of the fuzz issue (about two
minutes), and prints what they were answered.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from db import registry, tenants
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import Job
from tests.api.conftest import MAX_BODY_BYTES, SIGNATURES
from tests.api.strategies import bad_requests
from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp

BAD_REQUESTS = int(os.environ.get("TFFLEET_BAD_REQUESTS", "2000"))
BAD_SUBMISSIONS = BAD_REQUESTS * 3 // 5
BAD_READS = BAD_REQUESTS - BAD_SUBMISSIONS


def setup(database_url: str) -> tuple[dict[str, str], dict[str, str]]:
    """The fake fleet's signatures (as tests/api sees them), and keys of `load` and `fuzz`."""
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        for name, versions in SIGNATURES.items():
            for version, (inputs, outputs) in versions.items():
                registry.register(
                    session=session, name=name, version=version, format="savedmodel",
                    inputs=inputs, outputs=outputs,
                )  # fmt: skip
        keys = [tenants.create_key(session=session, tenant=t).key for t in ("load", "fuzz")]
    engine.dispose()
    return {"Authorization": f"Bearer {keys[0]}"}, {"Authorization": f"Bearer {keys[1]}"}


def jobs_of(database_url: str, tenant: str) -> Counter[str]:
    engine = make_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(Job.status, func.count()).where(Job.tenant == tenant).group_by(Job.status)
        ).all()
    engine.dispose()
    return Counter({status: count for status, count in rows})


class Load:
    """Valid jobs of tenant `load`, one after another with POST ?wait=, until stopped."""

    def __init__(self, fleet: Fleet, headers: dict[str, str]) -> None:
        self.fleet, self.headers = fleet, headers
        self.ids: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        body = {"model": "real", "inputs": {"x": [[0.5] * 8]}}
        with self.fleet.http(timeout=60, headers=self.headers) as client:
            while not self._stop.is_set():
                r = client.post("/v1/jobs", params={"wait": 10}, json=body)
                if r.status_code != 202:
                    self.errors.append(r.text)
                else:
                    self.ids.append(r.json()["id"])

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


# Hypothesis describes a failing example; a body of a megabyte makes a long description.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_bad_requests_under_load_get_4xx_and_store_nothing(fleet_factory, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    upgrade(database_url)
    load_key, fuzz_key = setup(database_url)
    build_mlp(tmp_path / "models", name="real")  # what `load` runs; `fuzz` aims at SIGNATURES
    # The body limit the strategies assume (their "too big" bodies are valid jobs otherwise).
    limits = {"TFFLEET_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    fleet = fleet_factory(database_url, tmp_path / "models", devices="cpu:1", extra_env=limits)
    fleet.start_api()
    fleet.start_worker()
    statuses: Counter[int] = Counter()
    started = time.monotonic()

    with Load(fleet, load_key) as load, fleet.http(timeout=30, headers=fuzz_key) as client:

        @settings(
            max_examples=BAD_SUBMISSIONS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(request=bad_requests())
        def submissions(request: tuple[bytes, str, dict[str, str]]) -> None:
            body, content_type, headers = request
            sent = {"Content-Type": content_type} if content_type else {}
            response = client.post("/v1/jobs", content=body, headers={**sent, **headers})
            statuses[response.status_code] += 1
            assert 400 <= response.status_code < 500, (response.status_code, response.text)

        @settings(max_examples=BAD_READS, deadline=None, database=None)
        @given(how=st.sampled_from(["get", "wait", "cancel", "status"]), pick=st.integers(0, 10**6))
        def reads_of_another_tenants_jobs(how: str, pick: int) -> None:
            if not load.ids:
                return
            job_id = load.ids[pick % len(load.ids)]
            if how == "status":
                response = client.post("/v1/jobs/status", json={"ids": [job_id]})
            elif how == "cancel":
                response = client.post(f"/v1/jobs/{job_id}/cancel")
            else:
                params = {"wait": 1} if how == "wait" else {}
                response = client.get(f"/v1/jobs/{job_id}", params=params)
            statuses[response.status_code] += 1
            assert response.status_code == 404, response.text

        submissions()
        reads_of_another_tenants_jobs()

    took = time.monotonic() - started
    print(
        f"{sum(statuses.values())} bad requests in {took:.0f} s beside {len(load.ids)} jobs of "
        f"load: {dict(statuses)}"
    )
    assert sum(statuses.values()) >= BAD_REQUESTS
    assert not any(status >= 500 for status in statuses)
    assert jobs_of(database_url, "fuzz") == Counter()
    assert not load.errors, load.errors[:3]
    assert load.ids and jobs_of(database_url, "load") == Counter({"succeeded": len(load.ids)})
