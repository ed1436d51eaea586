"""The API's heap (api/memory.py): glibc's thresholds, and startup's objects frozen once."""

from __future__ import annotations

import gc
import platform

import pytest

from api.memory import freeze_startup, keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds() -> None:
    assert keep_freed_memory()
    assert keep_freed_memory()  # again: as a second app in one process (the tests) does


def test_startup_is_frozen_once_and_what_comes_after_is_still_collected() -> None:
    freeze_startup()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    freeze_startup()  # a second app in one process (the tests): nothing more frozen
    assert gc.get_freeze_count() == frozen

    class Cycle:
        pass

    cycle = Cycle()
    cycle.self = cycle  # type: ignore[attr-defined]
    del cycle
    assert gc.collect() > 0
