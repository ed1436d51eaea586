"""bench/inline_limit.py runs: a smoke test, not a measurement (nothing here asserts a timing).

Two `tffleet api`s (256 KiB and 8 KiB inline limits, their SQLite files and file:// stores, a
private Redis), `--quick`: each kind of request is made against both and its figures printed.
"""

from __future__ import annotations

import re

import pytest

from bench import inline_limit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_each_request_is_measured_against_both_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert inline_limit.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "TFFLEET_INLINE_MAX_BYTES 262144 vs 8192" in out
    for row in ("JSON job, 1 image (48 KiB)", "JSON job, 4 images (192 KiB)", "Client.get"):
        # A ratio, or n/a where `--quick`'s few requests cost the API no clock tick.
        assert re.search(rf"{re.escape(row)}.* -> +-?\d+\.\d\d \((-?\d+\.\d\dx|  n/a)\)", out), out
