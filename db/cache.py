"""The response cache: a job whose model version, tenant and inputs equal those of a job that
succeeded ends at once with that job's outputs, without a forward pass.

Opt-in per model (`cache = true` in its model.toml). The API keys each job of such a model by
the sha256 of its model version, its tenant (or "*" where the model's `cache_shared = true`) and
its packed inputs (`key`); `db.jobs.create` answers a job whose key is stored (`answer`) and the
worker stores the outputs of each such job that succeeds (`remember`, from `db.jobs.complete`).
The sweeper keeps the cache within TFFLEET_CACHE_TTL_S and TFFLEET_CACHE_MAX_BYTES (`purge`).
An entry holds outputs only: it outlives the job that made it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Table, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.models import CacheEntry, JobStatus

_cache: Table = CacheEntry.__table__  # type: ignore[assignment]

SHARED = "*"  # the scope of a model whose cache every tenant shares


def key(*, model: str, version: int, scope: str, inputs: bytes) -> str:
    """The cache key of a job's packed inputs: equal inputs of one model version and scope."""
    digest = hashlib.sha256(f"{model}\0{version}\0{scope}\0".encode())
    digest.update(inputs)
    return digest.hexdigest()


def answer(*, session: Session, rows: Sequence[dict[str, Any]], now: datetime) -> set[str]:
    """Turn the new job rows whose `cache_key` is stored into succeeded jobs with the stored
    outputs (`cached`, no attempt, started and finished `now`); returns their ids."""
    keys = {row["cache_key"] for row in rows if row.get("cache_key")}
    if not keys:
        return set()
    found = dict(
        session.execute(select(_cache.c.key, _cache.c.outputs).where(_cache.c.key.in_(keys))).all()
    )
    answered = set()
    for row in rows:
        outputs = found.get(row.get("cache_key"))
        if outputs is None:
            continue
        row.update(
            status=JobStatus.SUCCEEDED.value,
            outputs=outputs,
            cached=True,
            started_at=now,
            finished_at=now,
        )
        answered.add(row["id"])
    return answered


def remember(*, session: Session, entries: Iterable[tuple[str, bytes]], now: datetime) -> None:
    """Store (key, outputs) pairs; a key stored already keeps its entry (the same outputs)."""
    rows = {
        k: {"key": k, "outputs": out, "size": len(out), "created_at": now} for k, out in entries
    }
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    session.execute(
        insert(_cache).on_conflict_do_nothing(index_elements=["key"]), list(rows.values())
    )


def forget(*, session: Session, keys: Sequence[str]) -> int:
    """Delete the entries of these keys (a job deleted by its client takes its outputs along)."""
    if not keys:
        return 0
    result = session.execute(delete(_cache).where(_cache.c.key.in_(list(keys))))
    return int(result.rowcount)  # type: ignore[attr-defined]


def purge(*, session: Session, older_than: datetime, max_bytes: int, limit: int) -> int:
    """Delete at most `limit` entries: those stored before `older_than`, then the oldest while
    all of them hold more than `max_bytes`. Returns how many."""
    old = list(
        session.scalars(
            select(_cache.c.key)
            .where(_cache.c.created_at < older_than)
            .order_by(_cache.c.created_at)
            .limit(limit)
        )
    )
    total = int(session.scalar(select(func.coalesce(func.sum(_cache.c.size), 0))) or 0)
    over = total - max_bytes
    if old:
        total_old = session.scalar(
            select(func.coalesce(func.sum(_cache.c.size), 0)).where(_cache.c.key.in_(old))
        )
        over -= int(total_old or 0)
    if over > 0 and len(old) < limit:
        rows = session.execute(
            select(_cache.c.key, _cache.c.size)
            .where(_cache.c.created_at >= older_than)
            .order_by(_cache.c.created_at)
            .limit(limit - len(old))
        ).all()
        for row in rows:
            if over <= 0:
                break
            old.append(row.key)
            over -= row.size
    if not old:
        return 0
    session.execute(delete(_cache).where(_cache.c.key.in_(old)))
    return len(old)
