"""Fair share with real processes: one tenant's backlog does not hold up another tenant's jobs.

Tenant `bulk` submits 20,000 one-sample jobs; tenant `web` then submits one job at a time and
waits for each (POST ?wait=). Each of web's jobs is claimed in the next batch beside the backlog,
so all of them end while thousands of the backlog's jobs are still queued (before fair share,
web's first job waited for the whole backlog: 23 s at about 1,000 samples/s). Latencies are
printed, not asserted (bench/run.py measures them): what is asserted is the order of events.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from sqlalchemy import func, select

from db import tenants
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import Job
from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp

BACKLOG = 20_000
PROBES = 5


def key(fleet: Fleet, tenant: str) -> dict[str, str]:
    engine = make_engine(fleet.database_url)
    with make_sessionmaker(engine).begin() as session:
        made = tenants.create_key(session=session, tenant=tenant)
    engine.dispose()
    return {"Authorization": f"Bearer {made.key}"}


def queued_of(database_url: str, tenant: str) -> int:
    engine = make_engine(database_url)
    with engine.connect() as conn:
        count = conn.scalar(
            select(func.count()).where(Job.tenant == tenant, Job.status == "queued")
        )
    engine.dispose()
    return int(count or 0)


def test_a_tenants_one_job_at_a_time_ends_while_anothers_backlog_is_still_queued(
    fleet_factory, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'fair.db'}"
    upgrade(database_url)
    build_mlp(tmp_path / "models")
    fleet = fleet_factory(database_url, tmp_path / "models", devices="cpu:1")
    fleet.start_api()
    fleet.start_worker()
    bulk, web = key(fleet, "bulk"), key(fleet, "web")
    x = np.ones((1, 8), np.float32).tolist()

    with fleet.http(timeout=60) as client:
        for _ in range(BACKLOG // 2000):
            chunk = {"jobs": [{"model": "mlp", "inputs": {"x": x}}] * 2000}
            response = client.post("/v1/jobs", json=chunk, headers=bulk)
            assert response.status_code == 202, response.text
        latencies, left = [], []
        for _ in range(PROBES):
            started = time.monotonic()
            response = client.post(
                "/v1/jobs",
                params={"wait": 30},
                json={"model": "mlp", "inputs": {"x": x}},
                headers=web,
            )
            latencies.append(time.monotonic() - started)
            assert response.json()["status"] == "succeeded", response.text
            left.append(queued_of(database_url, "bulk"))

    print(f"web's jobs took {[round(s, 3) for s in latencies]} s; bulk still queued: {left}")
    # In FIFO order each of web's jobs would end only after every bulk job queued before it: none
    # would be left. Some left at each of them is fair share. How many depends on how fast the
    # worker drains the backlog while the API is still storing it and between the probes: 2,337
    # down to 293 in a run on a loaded machine (three test processes on two cores), more on a
    # quiet one: so "some" is asked, not a share of the backlog.
    assert min(left) > 0, "web's jobs waited for the bulk backlog to drain"
