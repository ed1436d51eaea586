"""The chaos run's checker: the history against the jobs table, the store and the model.

- every acknowledged job and transform ended, and its row exists (none lost);
- an ended job never changed afterwards (a watcher reads the rows that end, every second, and the
  end reads them all again): its result was written once, by the fenced write of one attempt;
  each attempt is one `started` line of its history, and the worker of the last one wrote it;
- a succeeded job's outputs are the model's, x @ W, for the inputs its seed makes; a transform's
  parts hold each record once, in order, with the model's outputs;
- a job that failed is `worker_lost` and was running on a process or host that a fault hit;
- a worker host that a fault hit ran jobs again within STUCK_S of the fault's end (liveness).

Then the figures: jobs, faults of each kind, each fault's recovery, and job latency (created to
finished, the API's times) of the jobs whose life overlapped a fault and of the others.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import text

from bench.chaos.faults import Fault
from bench.chaos.load import FINAL, Load, inputs, stamp
from tests.e2e.hosts import JobsTable
from tffleet import tensors

# A worker host that ran no job for this long after its fault was over did not recover: a stall
# (a new child loads TensorFlow in 10 to 25 s on two busy cores).
STUCK_S = 60
ENDED = "SELECT id, status, finished_at, worker, attempts, outputs FROM jobs "


def _digest(row: Any) -> tuple[Any, ...]:
    outputs = hashlib.sha1(bytes(row.outputs)).hexdigest() if row.outputs else None
    return (row.status, row.finished_at, row.worker, row.attempts, outputs)


class Watcher:
    """Reads the rows that ended lately, every second; remembers each one as first seen ended,
    and any later change."""

    def __init__(self, table: JobsTable) -> None:
        self.table = table
        self.first: dict[str, tuple[Any, ...]] = {}
        self.changed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.read(
                    "WHERE parent_id IS NULL AND finished_at > "
                    "(clock_timestamp() AT TIME ZONE 'UTC') - interval '30 seconds'"
                )
            except Exception:  # PostgreSQL away for a moment
                continue

    def read(self, where: str, **params: Any) -> dict[str, Any]:
        with self.table.engine.connect() as conn:
            rows = {row.id: row for row in conn.execute(text(ENDED + where), params)}
        for job_id, row in rows.items():
            if row.status not in FINAL:
                continue
            seen = _digest(row)
            was = self.first.setdefault(job_id, seen)
            if was != seen:
                self.changed.append(f"{job_id}: {was[:4]} then {seen[:4]}")
        return rows


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)  # faults of each kind

    def fail(self, what: str, items: list[str]) -> None:
        if items:
            self.failures.append(f"{what}: {len(items)}, e.g. {items[:8]}")


def check(
    load: Load,
    faults: list[Fault],
    watcher: Watcher,
    weights: np.ndarray,
    read_part: Any,
    unfinished: list[str],
    *,
    host_of: Callable[[str | None], str | None],
    began: float,
    stopped: float,
    slow_s: float,
) -> Report:
    report = Report()
    report.fail("did not end", unfinished)
    ids = list(load.jobs)
    rows = watcher.read("WHERE id = ANY(:ids)", ids=ids)
    report.fail("acknowledged but lost (no row)", [i for i in ids if i not in rows])
    report.fail("changed after it ended (written twice)", watcher.changed)
    with watcher.table.engine.connect() as conn:
        query = text("SELECT id, history FROM jobs WHERE id = ANY(:ids)")
        history = {row.id: row.history for row in conn.execute(query, {"ids": ids})}
    victims = set().union(*(f.victims for f in faults)) if faults else set()
    wrong, bad_fail, attempts_off, lost = [], [], [], 0
    for job_id, submit in load.jobs.items():
        row = rows.get(job_id)
        if row is None:
            continue
        if row.status == "succeeded":
            got = tensors.unpack(bytes(row.outputs))["y"]
            want = inputs(submit.seed, submit.samples) @ weights
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                wrong.append(job_id)
        elif row.status == "failed" and submit.error_code == "worker_lost" and job_id in victims:
            lost += 1
        else:
            bad_fail.append(f"{job_id} {row.status} {submit.error_code} {submit.kind}")
        if submit.kind != "split":
            started = [
                line.split("\t") for line in (history.get(job_id) or "").splitlines()
                if line.startswith("started\t")
            ]  # fmt: skip
            last = started[-1][2] if started else None
            if len(started) != row.attempts or (row.status == "succeeded" and last != row.worker):
                attempts_off.append(f"{job_id} attempts={row.attempts} started={len(started)}")
    report.fail("outputs not the model's", wrong)
    report.fail("ended otherwise than succeeded, or worker_lost with a fault", bad_fail)
    report.fail("attempts and history disagree", attempts_off)
    report.fail("transforms", _transforms(load, weights, read_part))

    kinds = Counter(s.kind for s in load.jobs.values())
    statuses = Counter(s.status for s in load.jobs.values())
    report.lines.append(
        f"jobs: {len(load.jobs)} accepted ({dict(kinds)}), {dict(statuses)}, "
        f"{lost} worker_lost (all killed with a fault); {len(load.transforms)} transforms; "
        f"{load.retried} submits resent after no acknowledgement"
    )
    report.kinds = dict(Counter(f.kind for f in faults))
    report.lines.append(f"faults: {len(faults)} {report.kinds}")
    ran_on = {i: (host_of(row.worker), row.finished_at) for i, row in rows.items()}
    lines, stuck = _recoveries(load, faults, ran_on, began=began, stopped=stopped)
    lines.extend(_slow_victims(load, faults, history, slow_s=slow_s))
    report.lines.extend(lines)
    report.fail(f"a worker host ran no job for over {STUCK_S} s after its fault", stuck)
    report.lines.extend(_latencies(load, faults))
    return report


def _transforms(load: Load, weights: np.ndarray, read_part: Any) -> list[str]:
    bad = []
    for run in load.transforms.values():
        counts = run.answer.get("counts") or {}
        if run.status != "succeeded" or counts.get("succeeded") != run.records:
            bad.append(f"{run.transform_id} {run.status} {counts}")
            continue
        parts = [np.load(io.BytesIO(p)) for p in read_part(run.tenant, run.transform_id)]
        got = np.concatenate(parts) if parts else np.zeros((0, 2), np.float32)
        want = inputs(run.seed, run.records) @ weights
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            bad.append(f"{run.transform_id}: parts {got.shape}, want {want.shape}")
    return bad


def _recoveries(
    load: Load,
    faults: list[Fault],
    ran_on: dict[str, tuple[str | None, Any]],
    *,
    began: float,
    stopped: float,
) -> tuple[list[str], list[str]]:
    """Per fault: when jobs submitted after it was over first completed ("flowing"); for a fault
    of a worker host, when that host completed a job again ("host back": a restarted worker's
    children loaded, a resumed or reconnected one consuming again); when its victims ended."""
    lines = [
        "recovery (s after the fault was over): jobs submitted then first complete; the hit "
        "host completes a job again (or a sweeper is active); (s after the hit) the jobs it held "
        "all ended"
    ]
    stuck = []
    done = [s for s in load.jobs.values() if s.finished_at is not None]
    for f in faults:
        later = [s.finished_at for s in done if s.acked_at >= f.over_at and s.finished_at]
        flowing = f"flowing {min(later) - f.over_at:5.2f}" if later else "flowing never"
        back = ""
        if f.kind == "sweeper":
            active = f"{f.active_at - f.over_at:5.1f}" if f.active_at else "never"
            back = f"  a sweeper active again {active}"
        if f.target in ("w1", "w2"):
            again = [
                s.finished_at
                for s in done
                if s.finished_at and s.finished_at > f.over_at
                and ran_on.get(s.job_id, (None, None))[0] == f.target
            ]  # fmt: skip
            back = f"  host back {min(again) - f.over_at:5.1f}" if again else "  host back never"
            late = min(again) - f.over_at > STUCK_S if again else stopped - f.over_at > STUCK_S
            if late:
                stuck.append(f"{f.target} after {f.kind} at {f.at - began:.1f}s: {back.strip()}")
        ends = [load.jobs[v].finished_at for v in f.victims if v in load.jobs]
        ended = [e for e in ends if e is not None]
        victims = f"  {len(ended)} held, all ended {max(ended) - f.at:5.1f}" if ended else ""
        lines.append(
            f"  {f.at - began:6.1f}s {f.kind:8} {f.target:8} {f.detail:14} over after "
            f"{f.over_at - f.at:4.1f}  {flowing}{back}{victims}"
        )
    return lines, stuck


def _slow_victims(
    load: Load, faults: list[Fault], history: dict[str, str | None], *, slow_s: float
) -> list[str]:
    """The history of each job a fault hit that ended more than `slow_s` after the hit."""
    lines = []
    for f in faults:
        for job_id in sorted(f.victims):
            submit = load.jobs.get(job_id)
            if submit is None or submit.finished_at is None or submit.finished_at - f.at < slow_s:
                continue
            events = [
                f"{event} +{(stamp(at) or f.at) - f.at:.1f}s {detail}"
                for event, at, detail in (
                    line.split("\t") for line in (history.get(job_id) or "").splitlines()
                )
            ]
            lines.append(
                f"  slow after {f.kind} {f.target}: {submit.kind} job {job_id} ended "
                f"+{submit.finished_at - f.at:.1f}s; history: {'; '.join(events)}"
            )
    return lines


def _latencies(load: Load, faults: list[Fault]) -> list[str]:
    during: list[float] = []
    between: list[float] = []
    for s in load.jobs.values():
        if s.created_at is None or s.finished_at is None:
            continue
        hit = any(s.created_at <= f.over_at and s.finished_at >= f.at for f in faults)
        (during if hit else between).append(s.finished_at - s.created_at)

    def figures(values: list[float]) -> str:
        if not values:
            return "none"
        p50, p99 = np.percentile(values, [50, 99])
        return f"{len(values)} jobs, p50 {p50:.3f} s, p99 {p99:.3f} s"

    return [f"latency during faults: {figures(during)}", f"latency between: {figures(between)}"]
