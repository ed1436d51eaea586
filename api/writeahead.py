"""Objects the API writes before the rows that name them are committed: no orphan objects.

An upload's body, a large input, a streamed `.npy` job body: each is written to the object store
first and named by a row committed after. An API that dies (or a database that fails) between
the two would leave an object no row names, that nothing would ever delete. So before the write
its key is named as garbage due TFFLEET_UPLOAD_GRACE_S later, committed on its own
(`write_ahead`); the transaction that commits the naming row deletes that garbage row
(`db.objects.claim_in_time` in `create_upload`; in api/ingest.py `claim_those_in_time` for the
requests of one transaction at once, one statement that claims and checks), and a request that
fails deletes its objects at once and then their rows (`discard`). Whatever is left, the sweeper
deletes once due.

A row committed after its objects' garbage row is due is refused (503, `db.objects.too_late`):
the sweeper may be deleting them. The grace must exceed the longest upload (see settings.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from fastapi.concurrency import run_in_threadpool

from api.state import AppState
from db import clock, objects

log = logging.getLogger(__name__)


async def write_ahead(state: AppState, keys: Sequence[str]) -> None:
    """Name these objects as garbage due after the grace, committed before they are written."""
    if keys:
        await run_in_threadpool(_write_ahead, state, list(keys))


def _write_ahead(state: AppState, keys: list[str]) -> None:
    grace = timedelta(seconds=state.settings.upload_grace_s)
    with state.sessions.begin() as session:
        objects.write_ahead(session=session, keys=keys, not_before=clock.now(session) + grace)


async def discard(state: AppState, keys: Sequence[str]) -> None:
    """Delete objects no row names (a request that failed, a replayed one), then their garbage
    rows. A store or database that fails leaves the rows: the sweeper deletes them later."""
    if not keys:
        return
    try:
        await state.objects.delete_async(list(keys))
        await run_in_threadpool(_claim, state, list(keys))
    except Exception as exc:  # the store, or the database: the garbage rows stay for the sweeper
        log.warning("%d objects of requests not stored are left to the sweeper: %s", len(keys), exc)


def _claim(state: AppState, keys: list[str]) -> None:
    with state.sessions.begin() as session:
        objects.claim(session=session, keys=keys)
