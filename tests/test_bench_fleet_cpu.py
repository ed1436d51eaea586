"""bench/fleet_cpu.py: a process's CPU and its descendants', read from /proc around a run."""

from __future__ import annotations

import subprocess
import sys

from bench import fleet_cpu

SPIN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"


def test_a_process_and_its_children_are_counted_apart_per_job() -> None:
    # A parent that spins 0.3 s of CPU in a child of its own, then exits once it has.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {SPIN!r}])",
        ]
    )
    meter = fleet_cpu.CpuMeter([("parent", parent.pid)])
    before = meter.read()
    names: set[str] = set()
    most = 0.0  # a child's time counts while it lives (then it is its parent's `cutime`)
    while parent.poll() is None:
        spent = fleet_cpu.per_job(before, meter.read(), jobs=100)
        names |= set(spent)
        most = max(most, spent.get("parent children", 0.0))
    assert names <= {"parent", "parent children"}
    assert most > 0.5, most  # ms per job: 0.3 s of CPU over 100 jobs is 3 ms a job
    described = fleet_cpu.describe({"api": 0.8, "worker children": 0.25})
    assert described == "fleet 1.05 ms/job (api 0.80, worker children 0.25)"
