"""The worker's Celery app (`celery -A worker.app`): the broker contract plus the child's life.

Imported by the worker's main process and by Flower: no TensorFlow here. The hooks below run in
each forked child, which is where TensorFlow is loaded (worker/child.py).
"""

from __future__ import annotations

from celery.signals import worker_process_init, worker_process_shutdown

from tffleet.broker import make_celery
from tffleet.settings import get_settings

celery_app = make_celery(get_settings(), include=["worker.tasks"])


@worker_process_init.connect
def _init_child(**_: object) -> None:
    # Imported here: this runs in the forked child, which is where TensorFlow may be loaded.
    from worker import child

    child.init()


@worker_process_shutdown.connect
def _shutdown_child(**_: object) -> None:
    from worker import child

    child.shutdown()
