"""Registered model versions: the signatures the API validates submissions against."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.jobs import utcnow
from db.models import ModelVersion
from tffleet.errors import ModelNotFound


def register(
    *,
    session: Session,
    name: str,
    version: int,
    format: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    config: dict[str, Any] | None = None,
) -> None:
    """Record (or refresh) a model version's signature. Safe to race: it is an upsert."""
    values = {
        "name": name,
        "version": version,
        "format": format,
        "inputs": inputs,
        "outputs": outputs,
        "config": config or {},
        "registered_at": utcnow(),
    }
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    stmt = insert(ModelVersion).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["name", "version"],
        set_={
            k: stmt.excluded[k] for k in ("format", "inputs", "outputs", "config", "registered_at")
        },
    )
    session.execute(stmt)


def resolve(*, session: Session, name: str, version: int | None = None) -> ModelVersion:
    """The named version, or the latest registered one when `version` is None."""
    if version is None:
        latest = session.scalar(
            select(func.max(ModelVersion.version)).where(ModelVersion.name == name)
        )
        if latest is None:
            raise ModelNotFound(f"model: no model named {name!r} is registered")
        version = latest
    # register() upserts with Core: re-read the row, not an object this session already holds.
    found = session.get(ModelVersion, (name, version), populate_existing=True)
    if found is None:
        if session.scalar(select(ModelVersion.name).where(ModelVersion.name == name).limit(1)):
            raise ModelNotFound(f"version: model {name!r} has no version {version}")
        raise ModelNotFound(f"model: no model named {name!r} is registered")
    return found


def list_versions(*, session: Session) -> list[ModelVersion]:
    return list(
        session.scalars(select(ModelVersion).order_by(ModelVersion.name, ModelVersion.version))
    )
