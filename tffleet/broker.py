"""The broker contract between the API and the workers: the one module both services import.

What travels through Redis is a wake-up, never a job: a message names the task `run_batch`, a
model version and job ids whose rows are already committed (JSON only). A message can be lost,
repeated or late; the database, not the message, says what runs (docs/explanation/guarantees.md).

    api (Ingestor) ──Publisher.publish──▶ queue `tffleet.<model>` ──▶ worker child: run_batch
    sweeper, worker child (hand-backs) ──Publisher.publish──┘

Here: the task's name and argument order, the queue per model, the Celery app factory with the
settings durability depends on, and the publisher. No Celery app is built at import: the API
builds one in its lifespan, the worker in `worker.app`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from celery import Celery

from tffleet.redis_urls import celery_broker
from tffleet.settings import Settings

log = logging.getLogger(__name__)

# The one task: run_batch(model: str, version: int, job_ids: list[str]) (worker/tasks.py).
RUN_BATCH_TASK = "tffleet.run_batch"
QUEUE_PREFIX = "tffleet."
# What a worker consumes when its repository has no model, so that it still starts.
DEFAULT_QUEUE = f"{QUEUE_PREFIX}default"

# Wake-ups for jobs that ran before and were taken back (their worker died, or the database
# failed under them) jump the queue: with a backlog, a plain wake-up waits behind every message
# published before it, while these jobs already waited their turn once. Redis delivers the lower
# number first (kombu's Redis transport keeps one list per priority step, 0, 3, 6, 9, and BRPOPs
# them in that order); messages published before this existed sit in step 0 and stay first.
PRIORITY_WAKE = 3
PRIORITY_RETRY = 0
_PRIORITY_SEP = "\x06\x16"  # kombu's: the list of step N > 0 is named queue + sep + N

# Fail fast when Redis is away: the job is already durable and the sweeper republishes it.
PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}
# How long a Redis call may take, for the worker (its BRPOP polls every second, well inside it)
# and for a process that only publishes: a Redis that stops answering (not refusing: hung) then
# costs a submission about a second, not forever.
SOCKET_TIMEOUT_S = 5.0
PUBLISH_SOCKET_TIMEOUT_S = 0.4
# After a failed publish, the next ones within this time fail at once without trying: a dead or
# hung Redis costs one submission its timeouts, not every submission.
PUBLISH_BACKOFF_S = 1.0


def queue_for(model: str) -> str:
    """One queue per model, so a worker can serve a subset of the fleet's models."""
    return f"{QUEUE_PREFIX}{model}"


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold a queue's messages, in the order workers take them."""
    return [queue, f"{queue}{_PRIORITY_SEP}{PRIORITY_WAKE}"]


def make_celery(
    settings: Settings, *, include: Iterable[str] = (), socket_timeout_s: float = SOCKET_TIMEOUT_S
) -> Celery:
    """A Celery app on the fleet's broker; `include` names the modules that define tasks (the
    worker's), none for an app that only publishes (which passes PUBLISH_SOCKET_TIMEOUT_S)."""
    # A sentinel:// URL: kombu's form of it, and the master's name in the transport options.
    broker_url, sentinel_options = celery_broker(
        settings.broker_url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
    )
    app = Celery("tffleet", broker=broker_url, include=list(include))
    app.conf.update(
        # JSON only: a pickled message is refused, never executed.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        # Results live in the database; Celery keeps none.
        task_ignore_result=True,
        result_backend=None,
        # A message is acknowledged after its batch is written, and redelivered if the child dies.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # A child loads and warms its models in worker_process_init; Celery must wait for it.
        worker_proc_alive_timeout=settings.model_load_timeout_s,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": socket_timeout_s,
            **sentinel_options,
        },
        broker_connection_timeout=socket_timeout_s,
        # A batch's own time limit (job_timeout_s) is kept by the child itself, which then ends
        # (worker/batching.py). This is the last resort for a child stuck anywhere else (a
        # database call that never returns): the pool kills it once Redis would hand its
        # message to another worker anyway; its leases expire and the sweeper retries the jobs.
        task_time_limit=settings.visibility_timeout_s,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_default_queue=DEFAULT_QUEUE,
        worker_hijack_root_logger=False,
        # Task events cost the main process about as much as the task itself; Flower switches
        # them on when it connects (its `enable_events`), so they are off until someone looks.
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


class Publisher:
    """Wakes workers: publishes job ids to their model's queue, after their rows are committed."""

    def __init__(self, celery: Celery) -> None:
        self._celery = celery
        self._failed_at = -float("inf")  # time.monotonic() of the last failed publish

    def publish(
        self, *, model: str, version: int, job_ids: Sequence[str], retry: bool = False
    ) -> bool:
        """Returns False (and logs) when the broker could not take the message, or failed one
        less than PUBLISH_BACKOFF_S ago (the jobs stay queued for the sweeper either way).
        `retry`: the jobs were taken back from a worker; their wake-up goes first."""
        if time.monotonic() - self._failed_at < PUBLISH_BACKOFF_S:
            return False
        try:
            self._celery.send_task(
                RUN_BATCH_TASK,
                args=[model, version, list(job_ids)],
                queue=queue_for(model),
                priority=PRIORITY_RETRY if retry else PRIORITY_WAKE,
                retry=True,
                retry_policy=PUBLISH_RETRY_POLICY,
            )
        except Exception as exc:  # kombu raises many kinds; all mean "not published"
            log.warning(
                "publish of %d %s jobs failed (%s); they stay queued", len(job_ids), model, exc
            )
            self._failed_at = time.monotonic()
            return False
        self._failed_at = -float("inf")
        return True

    def ping(self) -> None:
        # One quick retry, no back-off: kombu's default first sleep is 2 s, longer than a probe's
        # usual timeout, so a dead broker would time the probe out instead of answering 503.
        with self._celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.1, timeout=2)
