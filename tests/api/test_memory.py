"""The API's heap thresholds (api/memory.py): set where the C library is glibc."""

from __future__ import annotations

import platform

import pytest

from api.memory import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds() -> None:
    assert keep_freed_memory()
    assert keep_freed_memory()  # again: as a second app in one process (the tests) does
