"""The worker main process's timer holds the tasks running now, not every task of the last hour
(worker/timers.py): the pool's canceled time-limit entries are purged."""

from __future__ import annotations

import heapq
from types import SimpleNamespace

from kombu.asynchronous import Hub
from kombu.asynchronous.timer import Timer

from worker.app import celery_app
from worker.timers import PurgeCanceledTimers, purge_canceled


def _noop() -> None:
    pass


def test_canceled_entries_are_removed_and_the_live_ones_kept_in_order() -> None:
    timer = Timer()
    # As the prefork pool does per task: an entry at its hard time limit, canceled once it ends.
    ended = [timer.call_after(3600, _noop) for _ in range(1000)]
    for tref in ended:
        tref.cancel()
    running = [timer.call_after(delay, _noop) for delay in (3600, 10, 1800)]
    assert len(timer.queue) == 1003

    assert purge_canceled(timer) == 1000

    assert {item.entry for item in timer._queue} == set(running)
    heap = list(timer._queue)
    heapq.heapify(heap)
    assert heap == timer._queue  # still a heap: the earliest first
    assert timer._queue[0].entry is running[1]
    assert purge_canceled(timer) == 0


def test_the_worker_step_purges_the_event_loops_timer_repeatedly() -> None:
    hub = Hub()
    step = PurgeCanceledTimers(SimpleNamespace())
    step.start(SimpleNamespace(hub=hub))
    for _ in range(500):
        hub.call_later(3600, _noop).cancel()
    repeating = heapq.heappop(hub.timer._queue).entry  # the first due, as the loop takes it
    assert not repeating.canceled

    repeating()  # its time came

    assert [item.entry for item in hub.timer._queue] == [repeating]  # rescheduled, alone
    step.stop(SimpleNamespace(hub=hub))
    assert repeating.canceled
    hub.close()


def test_the_worker_app_runs_the_step() -> None:
    assert PurgeCanceledTimers in celery_app.steps["worker"]
