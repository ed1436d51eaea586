"""A transform's Idempotency-Key: a client that sends `POST /v1/transforms` again after a lost
answer (the Python client does, with the same key) gets the transform the first request stored,
never a second one; the same key with another request is 409 `idempotency_key_reused`. Keys are
per tenant, as jobs' are (db/jobs/creation.py). Called by db/transform_control.py `create` and
the API's route (api/routes/transforms.py), which looks before it inspects any file.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.models import Transform
from tffleet.errors import IdempotencyKeyReused

_transforms: Table = Transform.__table__  # type: ignore[assignment]


def find_keyed(
    *, session: Session, tenant: str, key: str, request_hash: str | None
) -> Transform | None:
    """The tenant's transform stored under Idempotency-Key `key` (None: none is), if its request
    had this hash; another request under the same key is `IdempotencyKeyReused`."""
    stored = session.scalars(
        select(Transform).where(Transform.tenant == tenant, Transform.idempotency_key == key)
    ).one_or_none()
    if stored is not None and stored.request_hash != request_hash:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used for a different transform request "
            "(model, input, output or options differ); send a new key for a new request"
        )
    return stored


def insert_unless_key_taken(session: Session) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING on (tenant, idempotency_key): of two transactions
    racing on a key, the second waits for the first (PostgreSQL) or runs after it (SQLite)."""
    unique = [_transforms.c.tenant, _transforms.c.idempotency_key]
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return pg_insert(_transforms).on_conflict_do_nothing(index_elements=unique)
    if dialect == "sqlite":
        return sqlite_insert(_transforms).on_conflict_do_nothing(index_elements=unique)
    raise NotImplementedError(f"an idempotent transform is not implemented for {dialect}")
