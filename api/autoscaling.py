"""Autoscaling gauges on /metrics, per model, read from the database at scrape time.

They come from the database, not from this process's counters, so every API process answers
the same; under `tffleet api --workers N` the collector is registered once, beside the merged
process metrics (`api.metrics.exposition`). A burst of scrapes within `cache_s` costs one
round of queries. While the database does not answer, these gauges are left out rather than
reported as zeros (which would tell an autoscaler to scale down).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db import backlog
from db.backlog import Backlog

log = logging.getLogger(__name__)

# name, help, value
_GAUGES: tuple[tuple[str, str, Callable[[Backlog], float]], ...] = (
    ("tffleet_jobs_queued", "Jobs waiting for a worker", lambda b: b.queued),
    ("tffleet_jobs_running", "Jobs claimed by a worker child", lambda b: b.running),
    (
        "tffleet_oldest_queued_age_seconds",
        "Age of the oldest queued job by the database's clock (0: none queued)",
        lambda b: b.oldest_queued_age_s,
    ),
    (
        "tffleet_ready_children",
        "Live worker children holding a version of the model (loaded or draining)",
        lambda b: b.ready_children,
    ),
    (
        "tffleet_backlog_per_child",
        "(queued + running) / ready children, as if one child with none ready: scale on this",
        lambda b: b.per_child,
    ),
    (
        "tffleet_backlog_without_capacity",
        "1 while jobs are queued or running and no child is ready, else 0",
        lambda b: float(b.without_capacity),
    ),
    (
        "tffleet_model_stalled_seconds",
        "Seconds jobs of a version have been queued, with live children holding it, and none of "
        "them claiming (0: not stalled): workers connected but not consuming; alert above "
        "TFFLEET_STALL_WARN_S",
        lambda b: b.stalled_s,
    ),
)


class AutoscalingCollector(Collector):
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        poll_s: float,
        cache_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self._poll_s = poll_s  # TFFLEET_MODEL_POLL_S: how long a presence row stays live
        self._cache_s = cache_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._backlogs: dict[str, Backlog] | None = None  # None: the last read failed

    def describe(self) -> Iterator[Metric]:
        for name, help_text, _ in _GAUGES:
            yield GaugeMetricFamily(name, help_text, labels=["model"])

    def collect(self) -> Iterator[Metric]:
        backlogs = self._read()
        if backlogs is None:
            return
        for name, help_text, value in _GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["model"])
            for model, found in backlogs.items():
                family.add_metric([model], value(found))
            yield family

    def _read(self) -> dict[str, Backlog] | None:
        # Scrapes that arrive while one reads wait for it and take its answer.
        with self._lock:
            if self._read_at is None or self._monotonic() - self._read_at >= self._cache_s:
                try:
                    with self._sessions() as session:
                        self._backlogs = backlog.per_model(session=session, poll_s=self._poll_s)
                except SQLAlchemyError as exc:
                    log.warning("autoscaling metrics left out: database unreachable: %s", exc)
                    self._backlogs = None
                self._read_at = self._monotonic()
            return self._backlogs
