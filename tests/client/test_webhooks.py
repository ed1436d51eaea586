"""The clients' `webhook` and `webhook_events` (in a JSON body and in a binary body's query),
`webhook_secret`, and `tffleet.webhooks.verify` with that secret."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from db.engine import make_engine, make_sessionmaker
from db.models import Job
from tests.client.fleet import samples
from tests.client.test_against_api import InProcess, api  # noqa: F401  (a fixture, used by name)
from tffleet import webhooks
from tffleet.client.job import BINARY_BODY_MIN_BYTES

PUBLIC = "https://93.184.216.34/hooks"

pytestmark = pytest.mark.anyio


def stored(sqlite_url: str, job_id: str) -> tuple[str | None, int | None]:
    engine = make_engine(sqlite_url)
    with make_sessionmaker(engine)() as session:
        job = session.scalars(select(Job).where(Job.id == job_id)).one()
    engine.dispose()
    return job.webhook, job.webhook_events


async def test_submit_with_a_webhook_json_and_binary(api: InProcess, sqlite_url: str) -> None:  # noqa: F811
    small = await api.client.submit("double", samples(1), webhook=PUBLIC)
    assert stored(sqlite_url, small.id) == (PUBLIC, 2)
    large = np.zeros((BINARY_BODY_MIN_BYTES // 16 + 1, 4), np.float32)
    big = await api.client.submit(
        "double", large, webhook=PUBLIC, webhook_events=["start", "completed"]
    )
    assert api.transport.requests[-1].headers["content-type"] != "application/json"
    assert stored(sqlite_url, big.id) == (PUBLIC, 3)


async def test_the_secret_verifies_what_it_signs(api: InProcess) -> None:  # noqa: F811
    secret = await api.client.webhook_secret()
    assert secret.startswith("whsec_") and await api.client.webhook_secret() == secret
    body = b'{"id": "j", "status": "succeeded"}'
    headers = webhooks.headers(secret, "msg_1", body)
    assert webhooks.verify(secret, headers, body) == {"id": "j", "status": "succeeded"}
    with pytest.raises(webhooks.WebhookVerificationError):
        webhooks.verify(secret, headers, body + b" ")


async def test_submit_many_sends_the_webhook_with_every_job(
    api: InProcess,  # noqa: F811
    sqlite_url: str,
) -> None:
    jobs = await api.client.submit_many(
        "double", [samples(1)] * 3, chunk_size=2, webhook=PUBLIC, webhook_events=["start"]
    )
    assert len(jobs) == 3
    assert {stored(sqlite_url, job.id) for job in jobs} == {(PUBLIC, 1)}
    plain = await api.client.submit_many("double", [samples(1)])
    assert stored(sqlite_url, plain[0].id) == (None, None)
