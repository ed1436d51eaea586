"""Prometheus metrics of the API process."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

JOBS_SUBMITTED = Counter("tffleet_jobs_submitted_total", "Jobs accepted (202)", ["model"])
REQUESTS_REJECTED = Counter(
    "tffleet_requests_rejected_total", "Requests answered with an error", ["code"]
)
PUBLISH_FAILURES = Counter(
    "tffleet_publish_failures_total", "Wake-ups the broker did not take (jobs stay queued)"
)
SUBMIT_SECONDS = Histogram(
    "tffleet_submit_seconds",
    "Time to validate, store and publish a submission",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
