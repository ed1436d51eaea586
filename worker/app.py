"""The worker's Celery app (`celery -A worker.app`): the broker contract plus the child's life.

Imported by the worker's main process and by Flower: no TensorFlow here. The child hooks run in
each forked child, which is where TensorFlow is loaded (worker/child.py); the main process
watches its children and takes back a dead one's jobs at once (worker/orphans.py).
"""

from __future__ import annotations

import logging
import os
import time

from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
    worker_shutting_down,
)

from tffleet.broker import make_celery
from tffleet.settings import get_settings
from worker import orphans
from worker.drain import DRAIN
from worker.orphans import OrphanWatcher
from worker.timers import PurgeCanceledTimers

log = logging.getLogger(__name__)

# How long a child whose start failed waits before it exits for the pool to start another: a
# database or network that is down for a while costs a fork a few seconds, not a fork loop.
INIT_FAILED_EXIT_DELAY_S = 3.0

celery_app = make_celery(get_settings(), include=["worker.tasks"])
# Ended tasks' time-limit timers, removed rather than kept for an hour (worker/timers.py).
celery_app.steps["worker"].add(PurgeCanceledTimers)
_orphans: OrphanWatcher | None = None
# This worker's node name (`tffleet-<pid>@host`), inherited by its children: a child asks this
# worker, and no other, to consume the queue of a model it loaded after the start.
_nodename: str | None = None


@worker_init.connect
def _watch_children(sender: object = None, **_: object) -> None:
    # The main process, before it forks the pool.
    global _orphans, _nodename
    _nodename = getattr(sender, "hostname", None)
    _orphans = orphans.start_in_this_process()


@worker_shutdown.connect
def _stop_watching(**_: object) -> None:
    if _orphans is not None:
        _orphans.stop()


@worker_shutting_down.connect
def _begin_drain(**_: object) -> None:
    # Sent in the main process by the handler of SIGTERM (warm), SIGINT or SIGQUIT (cold): every
    # child, reading the shared flag, then claims nothing more (worker/drain.py).
    DRAIN.begin()


@worker_process_init.connect
def _init_child(**_: object) -> None:
    # Imported here: this runs in the forked child, which is where TensorFlow may be loaded.
    # The child is handed the app (for its wake-ups) rather than importing this module back.
    from worker import child

    try:
        child.init(celery_app, nodename=_nodename)
    except BaseException:
        # Celery logs a signal handler's error and keeps the child: one that never became a
        # tffleet child would take every wake-up its worker is sent and fail each at once
        # (a start during a network cut stalled a whole fleet, bench.chaos). It exits instead,
        # and the pool forks another.
        log.exception(
            "this worker child could not start; it exits in %.0f s and the pool starts another",
            INIT_FAILED_EXIT_DELAY_S,
        )
        time.sleep(INIT_FAILED_EXIT_DELAY_S)
        os._exit(1)


@worker_process_shutdown.connect
def _shutdown_child(**_: object) -> None:
    from worker import child

    child.shutdown()
