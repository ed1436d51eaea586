"""bench.soak's verdict: a robust slope over the last half, and the processes it samples."""

from __future__ import annotations

import argparse
import os

from bench import soak


def _samples(rss: list[float]) -> list[soak.Sample]:
    return [
        soak.Sample(t=i * 30.0, rss={"worker.1": v}, fds={"worker.1": 20}, redis_mb=1.0,
                    db_connections=None, db_mb=None)
        for i, v in enumerate(rss)
    ]  # fmt: skip


def test_theil_sen_ignores_a_few_allocator_steps() -> None:
    flat = [(float(x), 800.0) for x in range(20)]
    flat[5] = (5.0, 830.0)  # one arena grown and given back
    flat[12] = (12.0, 790.0)
    assert soak.theil_sen(flat) == 0.0
    assert soak.theil_sen([(float(x), 2.0 * x) for x in range(10)]) == 2.0


def test_rss_still_rising_over_the_last_half_fails_and_a_plateau_passes() -> None:
    args = argparse.Namespace(rss_tolerance=1.0, fd_tolerance=0.5)
    minute = soak.Minute(latencies=[0.01] * 100)
    # 20 samples, 30 s apart: rising 4 MB a minute to the end.
    rising = soak.report(_samples([766 + 2 * i for i in range(20)]), [minute] * 9, args)
    assert any("worker.1: RSS still rising" in leak for leak in rising)
    # Warming up in the first half, flat in the last.
    plateau = soak.report(_samples([766 + 4 * min(i, 8) for i in range(20)]), [minute] * 9, args)
    assert plateau == []


def test_p99_of_the_last_minute_over_twice_the_first_fails() -> None:
    args = argparse.Namespace(rss_tolerance=1.0, fd_tolerance=0.5)
    first, last = soak.Minute(latencies=[0.02] * 100), soak.Minute(latencies=[0.05] * 100)
    leaks = soak.report(_samples([800.0] * 10), [first, last], args)
    assert leaks == ["p99 of the last minute 50.0 ms > 2x the first's 20.0 ms"]


def test_a_process_and_its_children_are_sampled_by_role() -> None:
    found = soak.processes([("bench", os.getppid())])
    assert found["bench"] == os.getppid()
    assert os.getpid() in found.values()
    assert soak.rss_mb(os.getpid()) > 1 and soak.fds(os.getpid()) > 2
