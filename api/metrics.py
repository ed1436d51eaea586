"""Prometheus metrics of the API process, and what /metrics serves.

Under `tffleet api --workers N` every process writes its values to files in
PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode, which `tffleet api` sets up
before the processes start) and /metrics, whichever process answers, serves them merged:
counters and histograms summed over the processes. A Gauge defined here needs a
`multiprocess_mode` that says how (`livesum`, `max`, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

JOBS_SUBMITTED = Counter("tffleet_jobs_submitted_total", "Jobs accepted (202)", ["model"])
REQUESTS_REJECTED = Counter(
    "tffleet_requests_rejected_total", "Requests answered with an error", ["code"]
)
CACHE_LOOKUPS = Counter(
    "tffleet_cache_lookups_total",
    "Jobs of models with a response cache, by whether it answered them",
    ["model", "result"],
)
PUBLISH_FAILURES = Counter(
    "tffleet_publish_failures_total", "Wake-ups the broker did not take (jobs stay queued)"
)
SUBMIT_SECONDS = Histogram(
    "tffleet_submit_seconds",
    "Time to validate, store and publish a submission",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


class _ThisProcess(Collector):
    """The process-wide default registry, served through another registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def exposition(*collectors: Collector) -> CollectorRegistry:
    """The registry /metrics serves: this process's metrics, or every process's merged in
    multiprocess mode, and `collectors` (collected in the answering process only, once)."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    for collector in collectors:
        registry.register(collector)
    return registry
