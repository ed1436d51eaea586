"""bench/objects.py runs: a smoke test, not a measurement (nothing here asserts a timing).

(1) runs for real with `--quick --api-only` (a `tffleet api`, its SQLite file and file:// store,
a private Redis): each way of sending a 12.6 MB job is accepted and its API CPU printed. (2) and
(3) need TensorFlow and a fleet for minutes, so their report is checked on figures made up here.
"""

from __future__ import annotations

import os
import re

import pytest

from bench import objects

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_api_cpu_of_each_way_is_measured_and_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert objects.main(["--quick", "--api-only"]) == 0
    out = capsys.readouterr().out
    for way in ("JSON + base64 envelope", ".npy body", "upload + JSON by reference"):
        assert re.search(rf"{re.escape(way)}.* MB +\d+\.\d ms \(user", out), out
    assert "(1) .npy body vs JSON + base64, API CPU" in out
    assert "(<= 0.25)" in out


def test_fleet_figures_are_reported_round_by_round(capsys: pytest.CaptureFixture[str]) -> None:
    load = objects.Load(samples_per_s=900.0, client_ms=1.0, api_ms=6.0, worker_ms=250.0)
    fleet = {
        "loads": {"uploaded": [load, load], "client": [load, load]},
        # Before, between and after the runs: 1,100 beside the first, 1,200 the second...
        "in_process": [
            (1000.0, 257.0),
            (1200.0, 257.0),
            (1200.0, 257.0),
            (1000.0, 257.0),
            (800.0, 257.0),
        ],
        "batches": {32: 1000.0, 64: 900.0},
        "batch": 32,
        "db_per_job": 13_000.0,
        "db_jobs": 64,
        "inputs_blob": 158.0,
        "outputs_blob": 10_330.0,
    }
    rows = objects.fleet_rows(fleet)
    out = capsys.readouterr().out
    assert "round 2, in-process at batch 32" in out
    assert "1200 / 1200: 0.75x" in out  # 900 against the 1,200 beside it
    ratios = {name: value for name, value, _ in rows}
    assert ratios["(2) uploads by reference vs in-process beside it"] == pytest.approx(900 / 1100)
    assert ratios["(2) tffleet.Client, plain arrays, vs in-process"] == pytest.approx(0.875)
    assert ratios["    ... CPU per job, in-process / the fleet's"] == pytest.approx(257 / 257)
    assert ratios["(3) database growth per job, KB"] == pytest.approx(13_000 / 1024)


def test_cpu_of_a_process_tree_and_of_threads_by_kind() -> None:
    sum(range(2_000_000))  # some CPU of this process's own
    assert objects.tree_cpu_s(os.getpid()) > 0
    threads = objects.thread_cpu_s(os.getpid())
    assert set(threads) == set(objects.THREADS)
    assert threads["loop"] > 0
