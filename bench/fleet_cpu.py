"""The fleet's CPU per job, every process counted: the API, the worker's main process and its
children, the sweeper, Redis, and PostgreSQL's processes where the database is PostgreSQL.

Read from /proc (user + system time of each process, all its threads) before and after a
measured run, so the figure is what the fleet spent, whoever the load client is:

    meter = CpuMeter([("api", api_pid), ("worker", worker_pid), ("redis", redis_pid)])
    before = meter.read()
    ...                                   # the run: `jobs` jobs
    spent = per_job(before, meter.read(), jobs)
    print(describe(spent))                # fleet 1.21 ms/job (api 0.80, worker 0.08, ...)

A process's descendants count with it under one name (`worker children`: every child of the
worker's main process). PostgreSQL's server is no process of the fleet's, but its backends do
the fleet's work: with `postgres=True` every process named `postgres` counts, so the figure
includes what the server spent for anyone else in those seconds (nothing, on a bench machine).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """A process's name and the fields of /proc/PID/stat after it (state, ppid, ...)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, rest = raw.rsplit(")", 1)
    return head.split("(", 1)[1], rest.split()


def _processes() -> dict[int, tuple[str, list[str]]]:
    """Every live process's name and stat fields, by pid."""
    return {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p))}


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


class CpuMeter:
    """CPU seconds spent so far by each named process with its descendants (`roots`: name,
    pid), and by PostgreSQL's processes (`postgres`)."""

    def __init__(self, roots: Sequence[tuple[str, int]], *, postgres: bool = False) -> None:
        self.roots = list(roots)
        self.postgres = postgres

    def read(self) -> dict[str, float]:
        stats = _processes()
        children: dict[int, list[int]] = {}
        for pid, (_, fields) in stats.items():
            children.setdefault(int(fields[1]), []).append(pid)
        spent: dict[str, float] = {}
        for name, root in self.roots:
            if root in stats:
                spent[name] = _cpu_s(stats[root][1])
            todo = list(children.get(root, []))
            while todo:
                pid = todo.pop()
                spent[f"{name} children"] = spent.get(f"{name} children", 0.0) + _cpu_s(
                    stats[pid][1]
                )
                todo += children.get(pid, [])
        if self.postgres:
            spent["postgres"] = sum(
                _cpu_s(fields) for comm, fields in stats.values() if comm == "postgres"
            )
        return spent


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user and kernel) of `root` and every live process under it."""
    return sum(CpuMeter([("tree", root)]).read().values())


def per_job(before: Mapping[str, float], after: Mapping[str, float], jobs: int) -> dict[str, float]:
    """Milliseconds of CPU per job by process, from two readings around `jobs` jobs. A process
    that ended in between (a child replaced) counts from zero: its time is lost, not negative."""
    return {
        name: max(0.0, spent - before.get(name, 0.0)) / max(jobs, 1) * 1000
        for name, spent in after.items()
    }


def describe(ms: Mapping[str, float]) -> str:
    """`fleet 1.21 ms/job (api 0.80, worker 0.08, worker children 0.29, redis 0.04)`."""
    parts = ", ".join(f"{name} {value:.2f}" for name, value in ms.items())
    return f"fleet {sum(ms.values()):.2f} ms/job ({parts})"
