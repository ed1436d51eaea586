"""Prometheus metrics of the worker children (served by the main process: `worker.exporter`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


BATCH_SAMPLES = Histogram(
    "tffleet_batch_samples", "Samples per forward pass, before padding", ["model"],
    buckets=_SIZE_BUCKETS,
)  # fmt: skip
BATCH_JOBS = Histogram("tffleet_batch_jobs", "Jobs per batch", ["model"], buckets=_SIZE_BUCKETS)
QUEUE_WAIT_SECONDS = Histogram(
    "tffleet_queue_wait_seconds", "From submission to claim, per job", ["model"],
    buckets=_TIME_BUCKETS,
)  # fmt: skip
BATCH_SECONDS = Histogram(
    "tffleet_batch_run_seconds", "Time a batch spends on the device (forward passes, padding)",
    ["model"],
    buckets=_TIME_BUCKETS,
)  # fmt: skip
JOBS_FINISHED = Counter(
    "tffleet_jobs_finished_total", "Jobs a worker ended, by outcome", ["model", "status"]
)
DEVICE_BUSY_SECONDS = Counter(
    "tffleet_device_busy_seconds",
    "Seconds a device spent in forward passes: its rate is the device's busy fraction",
    ["device", "model"],
)
DEVICE_SECONDS = Counter(
    "tffleet_device_seconds",
    "Seconds of forward passes, each pass's split among its jobs by samples, by the jobs' tenant "
    "(the same seconds as tffleet_device_busy_seconds, counted as their batches are written)",
    ["tenant", "model"],
)
