"""How busy a child keeps its device: the seconds its forward passes took, per model version,
and the share of the last minute they make, reported with the child's presence (the console
shows it per device and per model).

The task thread adds each batch's device seconds; the report thread reads the shares. A share
is measured between two readings at least `min_span_s` apart, over the last `window_s` at most.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

WINDOW_S = 60.0
MIN_SPAN_S = 1.0


class BusyMeter:
    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        min_span_s: float = MIN_SPAN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._min_span_s = min_span_s
        self._clock = clock
        self._lock = threading.Lock()  # its own: the task thread never waits on a report
        self._totals: dict[Hashable, float] = {}
        # Past readings, oldest first: (when, the totals then).
        self._readings: deque[tuple[float, dict[Hashable, float]]] = deque()

    def add(self, key: Hashable, seconds: float) -> None:
        """`seconds` more of the device's time spent running `key`'s forward passes."""
        with self._lock:
            self._totals[key] = self._totals.get(key, 0.0) + seconds

    def shares(self) -> dict[Hashable, float]:
        """Each key's share (0 to 1) of the time since the oldest reading within the window;
        empty until two readings are `min_span_s` apart. Takes a reading."""
        with self._lock:
            now = self._clock()
            totals = dict(self._totals)
            self._readings.append((now, totals))
            # Keep the newest reading at least a window old (the span's start), and later ones.
            while len(self._readings) > 1 and now - self._readings[1][0] >= self._window_s:
                self._readings.popleft()
            then, before = self._readings[0]
            span = now - then
            if span < self._min_span_s:
                return {}
            return {
                key: min(1.0, max(0.0, (total - before.get(key, 0.0)) / span))
                for key, total in totals.items()
            }
