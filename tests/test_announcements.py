"""What workers announce when jobs end: ids, or whole jobs that round-trip exactly."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from tffleet import announcements
from tffleet.announcements import EndedJob

JOB = EndedJob(
    id="0190a000-0000-7000-8000-000000000001",
    model="mlp",
    version=2,
    priority=-1,
    created_at=datetime(2026, 11, 21, 8, 0, 0, 123456, tzinfo=UTC),
    started_at=datetime(2026, 11, 21, 8, 0, 0, 200001, tzinfo=UTC),
    finished_at=datetime(2026, 11, 21, 8, 0, 0, 300000, tzinfo=UTC),
    attempts=1,
    worker="host/12/cpu:0/abc123",
    outputs=b"TFT1\x00\xff binary",
)


def test_ids_and_whole_jobs_round_trip_exactly() -> None:
    message = announcements.encode(["plain-id", JOB])

    assert announcements.decode(message) == [("plain-id", None), (JOB.id, JOB)]


def test_an_item_it_cannot_read_is_announced_by_id_or_skipped() -> None:
    damaged = {**JOB.as_item(), "finished_at": "yesterday"}
    message = orjson.dumps([damaged, {"no": "id"}, 7, "ok"])

    assert announcements.decode(message) == [(JOB.id, None), ("ok", None)]
