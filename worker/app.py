"""The Celery app, imported by the API (to publish) and the worker main process: no TensorFlow."""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

from tffleet.settings import Settings, get_settings

RUN_BATCH_TASK = "tffleet.run_batch"
QUEUE_PREFIX = "tffleet."


def queue_for(model: str) -> str:
    """One queue per model, so a worker can serve a subset of the fleet's models."""
    return f"{QUEUE_PREFIX}{model}"


def make_celery(settings: Settings) -> Celery:
    app = Celery("tffleet", broker=settings.broker_url, include=["worker.tasks"])
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
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        # A batch's own time limit (job_timeout_s) is kept by the child itself, which then ends
        # (worker/batching.py). This is the last resort for a child stuck anywhere else (a
        # database call that never returns): the pool kills it once Redis would hand its
        # message to another worker anyway; its leases expire and the sweeper retries the jobs.
        task_time_limit=settings.visibility_timeout_s,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_default_queue=f"{QUEUE_PREFIX}default",
        worker_hijack_root_logger=False,
        # Task events cost the main process about as much as the task itself; Flower switches
        # them on when it connects (its `enable_events`), so they are off until someone looks.
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


celery_app = make_celery(get_settings())


@worker_process_init.connect
def _init_child(**_: object) -> None:
    # Imported here: this runs in the forked child, which is where TensorFlow may be loaded.
    from worker import child

    child.init()


@worker_process_shutdown.connect
def _shutdown_child(**_: object) -> None:
    from worker import child

    child.shutdown()
