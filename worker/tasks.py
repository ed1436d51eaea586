"""Celery tasks: thin adapters that read the message and call the batching logic."""

from __future__ import annotations

import logging

from tffleet.broker import RUN_BATCH_TASK
from worker import child
from worker.app import celery_app
from worker.retry import TASK_RETRY

log = logging.getLogger(__name__)


@celery_app.task(
    name=RUN_BATCH_TASK,
    # The database blinked: the batcher handed its leases back if it could; try again later.
    # A job's own fault is recorded on the job and never retried (worker/retry.py).
    **TASK_RETRY,
)
def run_batch(model: str, version: int, job_ids: list[str]) -> dict[str, int]:
    """Run the named jobs of one model version, topped up with other queued jobs."""
    current = child.current()
    key = (model, version)
    held = current.model_set.held
    with current.model_set.use(key) as loaded:
        if loaded is not None:
            # What the child's presence reports as its last claim (db/backlog.py `stalled_s`).
            with held.working(key):
                report = current.batcher.run(
                    model=model,
                    version=version,
                    job_ids=job_ids,
                    runner=loaded.runner,
                    policy=loaded.policy,
                    task_id=run_batch.request.id,
                )
            if report.claimed:
                held.claimed(key)
            return report.as_dict()
    return current.turn_away(model, version, job_ids).as_dict()
