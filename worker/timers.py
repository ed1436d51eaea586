"""The worker main process's timer, kept from growing with every task.

Celery's prefork pool keeps a task's time limit (`task_time_limit`, set to the broker's
visibility timeout: an hour by default, tffleet/broker.py) with one entry in the event loop's
timer per task. A task that ends cancels its entry, but kombu's timer only marks it canceled: it
stays in the heap, with its bound method and weak proxy, until its time comes. At ~40 tasks a
second that is ~150,000 dead entries an hour in the main process, about 2.5 MB a minute of RSS
growing for the whole first hour (celery/celery#1129, #5200). `PurgeCanceledTimers` removes the
canceled entries every `PURGE_EVERY_S`, so the heap holds only the tasks running now.
"""

from __future__ import annotations

import heapq
from typing import Any

from celery import bootsteps

PURGE_EVERY_S = 30.0


def purge_canceled(timer: Any) -> int:
    """Remove canceled entries from a kombu `Timer`'s heap, in place; returns how many."""
    queue = timer._queue  # a list kept as a heap of scheduled(eta, priority, entry)
    kept = [item for item in queue if not item.entry.canceled]
    removed = len(queue) - len(kept)
    if removed:
        heapq.heapify(kept)
        queue[:] = kept  # the same list: the timer's running iteration holds it
    return removed


class PurgeCanceledTimers(bootsteps.StartStopStep):
    """A worker bootstep: purge the event loop's timer every `PURGE_EVERY_S` (no event loop,
    as with the solo pool: nothing to do)."""

    requires = ("celery.worker.components:Hub",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._tref: Any = None

    def start(self, parent: Any) -> None:
        hub = getattr(parent, "hub", None)
        if hub is not None:
            self._tref = hub.call_repeatedly(PURGE_EVERY_S, purge_canceled, hub.timer)

    def stop(self, parent: Any) -> None:
        if self._tref is not None:
            self._tref.cancel()
            self._tref = None
