"""Storage gauges on /metrics: the bytes the fleet keeps on disk, read at scrape time.

Each gauge is named with its help in `GAUGES` and read by a `Source` that answers bytes or raises.
The database's size (`database_source`, from db/size.py) is one; the object store's size
(`object_store_sources`) is what the database accounts for in it (db/objects.py's
`stored_size`): two aggregates, no listing of the store, so a scrape costs the same however many
objects it holds, and a store that is down still shows what it should hold. As with the autoscaling
gauges (api/autoscaling.py), the collector is registered once per API, a burst of scrapes within
`cache_s` costs one read, and a source that does not answer is left out rather than reported as
0 bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from db import objects, size

log = logging.getLogger(__name__)

# Every storage gauge: its help (what `describe` says, and the metrics reference page).
GAUGES = {
    "tffleet_database_bytes": "The database's size on disk in bytes (SQLite: its file and WAL; "
    "PostgreSQL: pg_database_size)",
    "tffleet_object_store_bytes": "Bytes the fleet keeps in the object store, as its database "
    "accounts for them (uploads, and the inputs and outputs of jobs that own objects)",
    "tffleet_object_store_objects": "Owners of objects in the object store, as its database "
    "accounts for them: uploads, and jobs that own objects (each may hold several)",
}


@dataclass(frozen=True)
class Source:
    """One storage gauge of `GAUGES`: `read` answers its bytes, or raises while it cannot tell."""

    name: str
    read: Callable[[], float]


def database_source(sessions: sessionmaker[Session]) -> Source:
    """The database's size: PostgreSQL's `pg_database_size`, SQLite's pages and WAL file."""

    def read() -> float:
        with sessions() as session:
            return float(size.database_bytes(session=session))

    return Source("tffleet_database_bytes", read)


def object_store_sources(sessions: sessionmaker[Session]) -> list[Source]:
    """The object store's bytes and owners, from the database (`objects.stored_size`)."""

    def read(index: int) -> Callable[[], float]:
        def read_one() -> float:
            with sessions() as session:
                return float(objects.stored_size(session=session)[index])

        return read_one

    return [
        Source("tffleet_object_store_objects", read(0)),
        Source("tffleet_object_store_bytes", read(1)),
    ]


class StorageCollector(Collector):
    def __init__(
        self,
        sources: Sequence[Source],
        *,
        cache_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sources = list(sources)
        self._cache_s = cache_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._values: dict[str, float] = {}  # a source missing: its last read failed

    def describe(self) -> Iterator[Metric]:
        for name, help_text in GAUGES.items():
            yield GaugeMetricFamily(name, help_text)

    def collect(self) -> Iterator[Metric]:
        values = self._read()
        for source in self._sources:
            if source.name in values:
                yield GaugeMetricFamily(source.name, GAUGES[source.name], value=values[source.name])

    def _read(self) -> dict[str, float]:
        # Scrapes that arrive while one reads wait for it and take its answer.
        with self._lock:
            if self._read_at is None or self._monotonic() - self._read_at >= self._cache_s:
                self._values = {}
                for source in self._sources:
                    try:
                        self._values[source.name] = source.read()
                    except Exception as exc:  # a database or a store away: left out, not 0
                        log.warning("%s left out of /metrics: %s", source.name, exc)
                self._read_at = self._monotonic()
            return self._values
