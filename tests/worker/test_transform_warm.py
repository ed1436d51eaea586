"""worker/transform_warm.py: what a child's first shard would pay once, paid at its start."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest

from tffleet.datasets import writers
from worker import transform_warm


def test_warm_up_loads_what_a_shard_loads_on_first_use() -> None:
    """In a fresh interpreter (as a forked child's is, for these modules): the reader's and
    writer's lazy imports are done by the warm-up, and a second warm-up finds them done."""
    script = textwrap.dedent(
        """
        import json, sys
        from worker import transform_warm
        before = {m: m in sys.modules for m in ("pyarrow.compute", "numpy.ma")}
        first = transform_warm.warm_up()
        after = {m: m in sys.modules for m in ("pyarrow.compute", "numpy.ma")}
        print(json.dumps({"before": before, "after": after, "first": first}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == {"pyarrow.compute": False, "numpy.ma": False}
    assert seen["after"] == {"pyarrow.compute": True, "numpy.ma": True}
    assert seen["first"] > 0
    assert "warm-up failed" not in done.stderr


def test_a_failed_warm_up_is_logged_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> int:
        raise OSError("no room")

    monkeypatch.setattr(writers, "write_part", broken)
    with caplog.at_level(logging.WARNING, logger="worker.transform_warm"):
        seconds = transform_warm.warm_up()
    assert seconds >= 0
    assert "transform warm-up failed" in caplog.text
    assert "no room" in caplog.text
