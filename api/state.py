"""What the API process holds for its life: database, broker, object store, completion waiter,
signature cache."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.admission import Admission
from api.auth import Authenticator
from api.ingest import Ingestor, JobReader
from api.waiter import CompletionWaiter
from db import clock, presence, registry
from db.models import ModelVersion
from tffleet.broker import Publisher
from tffleet.objectstore import ObjectStore
from tffleet.settings import Settings


@dataclass
class SignatureCache:
    """Registered signatures, re-read at most every `poll_s`: submit is the hot path.

    Workers report what they hold every `poll_s` (TFFLEET_MODEL_POLL_S); trusting a cached
    answer no longer than that keeps "the latest version" as fresh as the reports are. A worker
    waits longer than that before it unloads a version it retired (worker/model_set.py).
    """

    sessions: sessionmaker[Session]
    poll_s: float = 5.0
    _entries: dict[tuple[str, int | None], tuple[float, dict[str, Any]]] = field(
        default_factory=dict
    )

    def cached(self, name: str, version: int | None) -> dict[str, Any] | None:
        """The signature if known and fresh, without touching the database."""
        hit = self._entries.get((name, version))
        if hit is not None and time.monotonic() - hit[0] < self.poll_s:
            return hit[1]
        return None

    def resolve(self, name: str, version: int | None) -> dict[str, Any]:
        key = (name, version)
        hit = self.cached(name, version)
        if hit is not None:
            return hit
        with self.sessions() as session:
            found: ModelVersion = registry.resolve(
                session=session,
                name=name,
                version=version,
                live_since=presence.live_since(self.poll_s, clock.now(session)),
            )
            entry = {
                "name": found.name,
                "version": found.version,
                "inputs": found.inputs,
                "outputs": found.outputs,
                "config": found.config or {},
            }
        self._entries[key] = (time.monotonic(), entry)
        return entry


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]  # writes
    reads: sessionmaker[Session]  # reads (a shared transaction on SQLite)
    publisher: Publisher
    waiter: CompletionWaiter
    signatures: SignatureCache
    ingestor: Ingestor
    reader: JobReader
    admission: Admission
    auth: Authenticator
    # Large tensors: uploads, inputs over TFFLEET_INLINE_MAX_BYTES, outputs by reference.
    objects: ObjectStore


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.tffleet
    return state


StateDep = Annotated[AppState, Depends(get_state)]
