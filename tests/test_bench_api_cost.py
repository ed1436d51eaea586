"""bench/api_cost.py runs: a smoke test, not a measurement (nothing here asserts a timing).
`--quick` for real: a `tffleet api`, its SQLite file and file:// store, a private Redis; each
way is accepted and its API CPU printed by thread."""

from __future__ import annotations

import re

import pytest

from bench import api_cost

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_each_ways_api_cpu_is_measured_and_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert api_cost.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for way in ("small JSON job (one sample)", ".npy body, 12.6 MB", "JSON + base64, 16.8 MB"):
        assert re.search(rf"{re.escape(way)} +\d+ jobs +\d+\.\d\d ms +\(loop", out), out
    assert ".npy body vs JSON + base64, API CPU" in out
    assert "(<= 0.25)" in out
