"""Waking workers: publish job ids to the model's Celery queue, after their rows are committed."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import Celery

from worker.app import RUN_BATCH_TASK, queue_for

log = logging.getLogger(__name__)

# Fail fast when Redis is away: the job is already durable and the sweeper republishes it.
_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}


class Publisher:
    def __init__(self, celery: Celery) -> None:
        self._celery = celery

    def publish(self, *, model: str, version: int, job_ids: Sequence[str]) -> bool:
        """Returns False (and logs) when the broker could not take the message."""
        try:
            self._celery.send_task(
                RUN_BATCH_TASK,
                args=[model, version, list(job_ids)],
                queue=queue_for(model),
                retry=True,
                retry_policy=_RETRY_POLICY,
            )
        except Exception as exc:  # kombu raises many kinds; all mean "not published"
            log.warning(
                "publish of %d %s jobs failed (%s); they stay queued", len(job_ids), model, exc
            )
            return False
        return True

    def ping(self) -> None:
        # One quick retry, no back-off: kombu's default first sleep is 2 s, longer than a probe's
        # usual timeout, so a dead broker would time the probe out instead of answering 503.
        with self._celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.1, timeout=2)
