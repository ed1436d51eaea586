"""What workers announce when jobs end: ids, or whole jobs that round-trip exactly."""

from __future__ import annotations

import hashlib
import hmac
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
    deadline_at=datetime(2026, 11, 21, 8, 1, 0, tzinfo=UTC),
    queue_timeout_at=datetime(2026, 11, 21, 8, 0, 30, tzinfo=UTC),
)


KEY = b"0123456789abcdef" * 4


def test_ids_and_whole_jobs_round_trip_exactly() -> None:
    message = announcements.encode(["plain-id", JOB], key=KEY)

    assert announcements.decode(message, key=KEY) == [("plain-id", None), (JOB.id, JOB)]


def test_an_item_it_cannot_read_is_announced_by_id_or_skipped() -> None:
    damaged = {**JOB.as_item(), "finished_at": "yesterday"}
    payload = orjson.dumps([damaged, {"no": "id"}, 7, "ok"])
    message = hmac.new(KEY, payload, hashlib.sha256).hexdigest().encode() + b" " + payload

    assert announcements.decode(message, key=KEY) == [(JOB.id, None), ("ok", None)]


def test_a_whole_job_not_signed_with_the_fleets_key_is_taken_for_its_id_only() -> None:
    forged = announcements.encode([JOB], key=b"someone else's key")
    unsigned = orjson.dumps([JOB.as_item()])

    assert announcements.decode(forged, key=KEY) == [(JOB.id, None)]
    assert announcements.decode(unsigned, key=KEY) == [(JOB.id, None)]
    assert announcements.decode(announcements.encode([JOB], key=KEY), key=None) == [(JOB.id, None)]


def test_a_bare_list_of_ids_wakes_its_jobs_and_garbage_wakes_none() -> None:
    assert announcements.decode(orjson.dumps(["a", "b"]), key=KEY) == [("a", None), ("b", None)]
    for garbage in (b"", b"not json", b"{}", b"x" * 64 + b" [1"):
        assert announcements.decode(garbage, key=KEY) == []
