"""`tffleet api --workers 2`: a key's rate holds across the API's processes (one bucket in
Redis), whichever process answers each request."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client import multiprocess
from sqlalchemy.orm import Session, sessionmaker

from db import key_limits, tenants
from tests.cli.test_api_workers import BODY, MODEL, Api, api, tmpdir_of_api  # noqa: F401

pytestmark = pytest.mark.slow

BURST = 10


def answered_by_process(metrics_dir: Path) -> dict[str, float]:
    """Submits each process took (stored, or refused for the rate): {file name: count}."""
    counts: dict[str, float] = {}
    for path in sorted(metrics_dir.glob("counter_*.db")):
        for family in multiprocess.MultiProcessCollector.merge([str(path)]):
            for sample in family.samples:
                labels = sample.labels
                if (
                    sample.name == "tffleet_jobs_submitted_total" and labels.get("model") == MODEL
                ) or (
                    sample.name == "tffleet_requests_rejected_total"
                    and labels.get("code") == "rate_limited"
                ):
                    counts[path.name] = counts.get(path.name, 0) + sample.value
    return counts


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_keys_rate_holds_across_the_api_processes(
    api: Api,  # noqa: F811
    sessions: sessionmaker[Session],
    tmpdir_of_api: Path,  # noqa: F811
) -> None:
    with sessions.begin() as session:
        made = tenants.create_key(session=session, tenant="acme")
        key_limits.set_key_limits(session=session, row=made.row, rate_per_s=0.01, rate_burst=BURST)
    headers = {"Authorization": f"Bearer {made.key}", "Connection": "close"}
    (metrics_dir,) = tmpdir_of_api.glob("tffleet-api-metrics-*")

    def submit(_: int) -> int:
        # A connection per request, so that both processes take some.
        with httpx.Client(base_url=api.url, timeout=30) as client:
            return client.post("/v1/jobs", json=BODY, headers=headers).status_code

    codes: list[int] = []
    with ThreadPoolExecutor(8) as pool:
        for round_ in range(40):  # 4 rounds at least (32 requests), until both have answered
            codes += pool.map(submit, range(8))
            answered = [n for n in answered_by_process(metrics_dir).values() if n > 0]
            if round_ >= 3 and len(answered) == 2:
                break

    assert len([n for n in answered_by_process(metrics_dir).values() if n > 0]) == 2
    assert set(codes) == {202, 429}
    assert codes.count(202) == BURST  # one bucket: the burst, once, across both
