"""The sweeper's step for the object store: objects no row names any more are deleted.

Rows that named objects (jobs, their inputs, uploads) leave, as they are deleted, what they named
in `object_garbage`, in the same transaction (db/objects.py). This step first deletes uploads
past their expiry that no job keeping its inputs pins (which leaves their objects there too),
then deletes what `object_garbage` names from the store, a bounded chunk at a time, and only
then the garbage rows. Rows the API wrote ahead of an object's write wait for their
`not_before` (TFFLEET_UPLOAD_GRACE_S on): until then the row that names the object may still
be committed. A store that does not answer leaves the rows for the next sweep: an
object is deleted late, never early, and deleting one twice is no error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from db import clock as db_clock
from db import objects
from tffleet.objectstore import ObjectStore, StoreUnavailable

log = logging.getLogger(__name__)

# Garbage rows (an object, or a job's prefix) per chunk, and chunks per sweep.
CHUNK = 500
MAX_CHUNKS = 20


@dataclass
class GarbageReport:
    uploads_purged: int = 0  # uploads past their expiry, deleted with their objects
    objects_deleted: int = 0  # objects deleted from the store
    store_unavailable: bool = False  # the store did not answer: the rest waits for next sweep


def collect(
    sessions: sessionmaker[Session],
    store: Callable[[], ObjectStore],
    *,
    clock: Callable[[Session], datetime] = db_clock.now,
    chunk: int = CHUNK,
    max_chunks: int = MAX_CHUNKS,
) -> GarbageReport:
    """One sweep's work: expired uploads, then the garbage they and deleted jobs left. `store`
    opens the store: called only when there is garbage (a fleet that stores nothing never
    opens one)."""
    report = GarbageReport()
    for _ in range(max_chunks):
        with sessions.begin() as session:
            purged = objects.purge_uploads(session=session, now=clock(session), limit=chunk)
        report.uploads_purged += purged
        if purged < chunk:
            break
    for _ in range(max_chunks):
        with sessions() as session:
            found = objects.take_garbage(session=session, limit=chunk, now=clock(session))
        if not found:
            break
        try:
            report.objects_deleted += _delete(store(), found)
        except StoreUnavailable as exc:
            log.warning("object store unavailable; its garbage waits for the next sweep: %s", exc)
            report.store_unavailable = True
            break
        with sessions.begin() as session:
            objects.forget_garbage(session=session, ids=[garbage.id for garbage in found])
        if len(found) < chunk:
            break
    return report


def _delete(store: ObjectStore, found: list[objects.Garbage]) -> int:
    """Delete what the rows name; returns how many objects that was."""
    doomed = [garbage.key for garbage in found if not garbage.prefix]
    for garbage in found:
        if garbage.prefix:
            doomed += store.keys(garbage.key)
    store.delete(doomed)
    return len(doomed)
