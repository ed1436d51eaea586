"""The device's busy share per model version (worker/busy.py), on a fake clock."""

from __future__ import annotations

import pytest

from worker.busy import BusyMeter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_share_needs_two_readings_a_second_apart_then_is_busy_time_over_elapsed() -> None:
    clock = Clock()
    meter = BusyMeter(clock=clock)
    assert meter.shares() == {}
    meter.add(("mlp", 1), 0.2)
    clock.now = 0.5
    assert meter.shares() == {}  # half a second: too short to say
    meter.add(("mlp", 1), 1.0)
    meter.add(("cnn", 1), 0.5)
    clock.now = 2.0
    assert meter.shares() == pytest.approx({("mlp", 1): 0.6, ("cnn", 1): 0.25})


def test_the_share_covers_the_last_minute_not_all_time() -> None:
    clock = Clock()
    meter = BusyMeter(clock=clock, window_s=60)
    meter.shares()
    meter.add("m", 60.0)  # busy the whole first minute
    for second in range(10, 130, 10):
        clock.now = float(second)
        shares = meter.shares()
    # Idle since: the window now starts at the reading a minute or more ago, after the busy time.
    assert shares["m"] == pytest.approx(0.0)


def test_a_share_is_at_most_one() -> None:
    clock = Clock()
    meter = BusyMeter(clock=clock)
    meter.shares()
    meter.add("m", 5.0)  # a pipeline's overlap can count more than the wall clock
    clock.now = 2.0
    assert meter.shares() == {"m": 1.0}
