"""A transform's end reaches its webhook: the outbox row its last shard's transaction wrote, sent
by the real deliverer (worker/webhooks.py) to a real receiver, signed, its body the transform as
GET /v1/transforms/{id} shows it. On SQLite and PostgreSQL (tests/db/conftest.py)."""

from __future__ import annotations

import threading

import standardwebhooks
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, tenants, transform_control, transforms, webhooks
from db.models import DEFAULT_TENANT
from tests.db.test_transforms import new_transform
from tests.receivers import Receiver
from tffleet.settings import Settings
from worker.webhooks import Deliverer

Sessions = sessionmaker[Session]


def test_its_end_is_delivered_signed_with_the_transform_as_get_shows_it(
    sessions: Sessions, db_url: str, redis_url: str
) -> None:
    settings = Settings(
        database_url=db_url, broker_url=redis_url, webhook_allow_private=True, webhook_poll_s=0.05
    )
    stop = threading.Event()
    with Receiver() as receiver:
        new = new_transform(
            [15], webhook=receiver.url, webhook_events=int(webhooks.Event.COMPLETED)
        )
        with sessions.begin() as session:
            tenants.ensure_tenant(session=session, name=DEFAULT_TENANT)
            transform, shard_ids = transform_control.create(session=session, new=new)
        with sessions.begin() as session:
            leases = jobs.claim(session=session, job_ids=shard_ids, owner="w", lease_s=60)
        for lease in leases:
            with sessions.begin() as session:
                jobs.complete(session=session, results=[(lease, b"")])
                transforms.shard_finished(
                    session,
                    job_id=lease.job_id,
                    transform_id=transform.id,
                    succeeded=lease.samples,
                    failed=0,
                )
        thread = Deliverer(sessions, settings).start(stop)
        try:
            (hit,) = receiver.wait_for(1)
        finally:
            stop.set()
            thread.join(timeout=10)
    with sessions() as session:
        secret = webhooks.secret(session=session, tenant=DEFAULT_TENANT)
    body = standardwebhooks.Webhook(secret).verify(hit.body, hit.headers)
    assert body["id"] == transform.id and body["status"] == "succeeded"
    assert body["counts"] == {"records": 15, "succeeded": 15, "failed": 0}
    assert body["shards"]["done"] == 2 and body["finished_at"] is not None
    assert body["output"]["files"] == [
        "file:///srv/out/part-00000.jsonl",
        "file:///srv/out/part-00001.jsonl",
    ]
