"""Job ids: UUIDv7 that keep growing in one process, whatever the clock does."""

from __future__ import annotations

import uuid

import pytest

from db import ids


def test_job_ids_keep_growing_within_a_millisecond_and_when_the_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now_ns = [1_900_000_000_000 * 1_000_000]
    monkeypatch.setattr(ids.time, "time_ns", lambda: now_ns[0])
    made = [ids.new_job_id() for _ in range(1000)]
    now_ns[0] -= 5_000 * 1_000_000  # NTP steps the clock back 5 s
    made += [ids.new_job_id() for _ in range(10)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert uuid.UUID(made[0]).int >> 80 == 1_900_000_000_000  # the time stamp, in ms
