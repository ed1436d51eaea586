"""What the fleet keeps on disk, shown: `tffleet_database_bytes` and the object store's size
(as the database accounts for it) on /metrics, the console's storage, and a retry after the
inputs' retention (410 `inputs_gone` naming the setting).

On the real app and database, both backends; the sweeper's deletion is played through `db.jobs`
(tests/worker/test_sweeper.py runs the sweeper's own step).
"""

from __future__ import annotations

import io
from datetime import timedelta

import numpy as np
import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from api import storage
from api.storage import Source, StorageCollector
from db import jobs, size
from db.models import JobErrorCode
from tests.api.conftest import Api, OpenApi
from tffleet import tensors

pytestmark = [pytest.mark.anyio, pytest.mark.both_databases]

Sessions = sessionmaker[Session]
X = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
NAME = "tffleet_database_bytes"


async def submit(api: Api) -> str:
    response = await api.client.post("/v1/jobs", json=X)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def fail(sessions: Sessions, job_id: str) -> None:
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="w", lease_s=60)
        jobs.fail(session=session, leases=[lease], code=JobErrorCode.MODEL_ERROR, message="boom")


def sweep_inputs(sessions: Sessions, job_id: str) -> int:
    """What the sweeper does once the job ended more than TFFLEET_INPUT_TTL_S ago."""
    with sessions.begin() as session:
        ended = jobs.get(session=session, job_id=job_id).finished_at
        assert ended is not None
        return jobs.purge_inputs(
            session=session,
            since=ended - timedelta(hours=1),
            older_than=ended + timedelta(seconds=1),
            limit=10,
        ).deleted


async def test_a_retry_within_the_input_retention_runs_and_after_it_is_410_naming_it(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(input_ttl_s=600) as api:
        job_id = await submit(api)
        fail(sessions, job_id)
        within = await api.client.post(f"/v1/jobs/{job_id}/retry")
        assert within.status_code == 200, within.text
        fail(sessions, job_id)
        assert sweep_inputs(sessions, job_id) == 1

        after = await api.client.post(f"/v1/jobs/{job_id}/retry")
        job = await api.client.get(f"/v1/jobs/{job_id}")

    assert after.status_code == 410, after.text
    error = after.json()["error"]
    assert error["code"] == "inputs_gone"
    assert "kept for TFFLEET_INPUT_TTL_S (600 s) after it ends" in error["message"]
    # Nothing half-done: the job stays as it ended, its error and all.
    assert job.json()["status"] == "failed" and job.json()["error"]["code"] == "model_error"


async def test_metrics_show_the_database_size(api: Api, sessions: Sessions) -> None:
    response = await api.client.get("/metrics")

    assert response.status_code == 200, response.text
    (family,) = (f for f in text_string_to_metric_families(response.text) if f.name == NAME)
    (sample,) = family.samples
    with sessions() as session:
        now = size.database_bytes(session=session)
    assert sample.value > 0
    assert sample.value == pytest.approx(now, rel=0.5)  # the same figure, give or take writes


async def test_with_the_database_down_the_size_is_left_out_not_zero(open_api: OpenApi) -> None:
    dead = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # nothing listens on port 1
    async with open_api(database_url=dead, metrics_public=True) as api:
        response = await api.client.get("/metrics")

    assert response.status_code == 200
    assert NAME not in response.text


def test_a_source_that_cannot_tell_is_left_out_and_the_others_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The object store's sizes are two more `Source`s beside the database's."""

    def unreachable() -> float:
        raise OSError("the store is away")

    monkeypatch.setitem(storage.GAUGES, "tffleet_b_bytes", "B")
    registry = CollectorRegistry()
    registry.register(
        StorageCollector(
            [
                Source(NAME, lambda: 42.0),
                Source("tffleet_b_bytes", unreachable),
            ]
        )
    )

    assert registry.get_sample_value(NAME) == 42.0
    assert registry.get_sample_value("tffleet_b_bytes") is None


async def test_the_console_shows_the_database_size_the_inputs_kept_and_the_retentions(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(input_ttl_s=600, result_ttl_s=86400) as api:
        for _ in range(2):
            await submit(api)
        response = await api.client.get("/v1/console/overview")

    assert response.status_code == 200, response.text
    storage = response.json()["storage"]
    assert storage["database_bytes"] > 0
    assert storage["inputs_kept"] == 2
    postgres = sessions.kw["bind"].dialect.name == "postgresql"
    assert (storage["inputs_bytes"] > 0) if postgres else storage["inputs_bytes"] is None
    assert (storage["input_ttl_s"], storage["result_ttl_s"]) == (600, 86400)
    assert {"cache_ttl_s", "cache_max_bytes"} <= set(storage)


async def test_metrics_and_the_console_show_the_object_stores_size(
    open_api: OpenApi, sessions: Sessions
) -> None:
    """What the database accounts for in the store: an upload and a job with an input over
    the inline limit, their objects' bytes (read back from the store to compare)."""
    array = np.arange(24, dtype=np.float32).reshape(6, 4)
    buffer = io.BytesIO()
    np.save(buffer, array)
    async with open_api(inline_max_bytes=64) as api:
        upload = await api.client.post(
            "/v1/uploads", content=buffer.getvalue(), headers={"Content-Type": tensors.NPY}
        )
        job = await api.client.post(
            "/v1/jobs", json={"model": "mlp", "inputs": {"x": array.tolist()}}
        )
        assert upload.status_code == 201 and job.status_code == 202, job.text
        metrics = await api.client.get("/metrics")
        console = await api.client.get("/v1/console/overview")
        held = api.state.objects.total_bytes()

    def gauges(text: str) -> dict[str, float]:
        return {
            f.name: f.samples[0].value
            for f in text_string_to_metric_families(text)
            if f.name.startswith("tffleet_object_store_")
        }

    assert held[0] == 2
    assert gauges(metrics.text) == {
        "tffleet_object_store_objects": 2,
        "tffleet_object_store_bytes": held[1],
    }
    shown = console.json()["storage"]
    assert (shown["object_store_objects"], shown["object_store_bytes"]) == (2, held[1])
    assert shown["upload_ttl_s"] == 24 * 3600
