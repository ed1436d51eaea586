"""bench/hotpath.py runs: a smoke test, not a measurement (nothing here asserts a timing).
`--quick` for real: the app in this process on SQLite, a private Redis; both requests are
answered both ways and their CPU printed."""

from __future__ import annotations

import re

import pytest

from bench import hotpath

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_both_requests_are_measured_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    assert hotpath.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for request in ("POST /v1/jobs", "GET /v1/jobs/{id}"):
        line = rf"{re.escape(request)} +past the router +\d+ us, through the router +\d+ us:"
        assert re.search(line, out), out
