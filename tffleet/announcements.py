"""What a worker announces on JOBS_DONE_CHANNEL once jobs have ended, and how the API reads it.

A message is a JSON list. An item is a job id, or, for a job that succeeded with small outputs,
the job as it was just committed: a long-poll then answers from the announcement instead of
reading the database again (a read is most of what an idle round trip costs after the commit).

Only a job whose row the announcing worker has written may be announced whole: the values are
those the row holds, and a job that has ended never changes again.

A client's answer may be made of an announcement only if the API can trust it: a message carries
an HMAC-SHA256 of its payload under the fleet's announcement key, which workers and API processes
read from the database (`db.secrets`) and nothing else holds. A message that is not signed so (a
sweeper's list of ids, an older worker's, a stranger's) wakes its jobs' long-polls, which then read
the database: its ids are hints, its whole jobs are ignored.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Container
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import pybase64

# Outputs one announcement carries at most, all its jobs together; the jobs past it are announced
# by id and read from the database: every API process receives every announcement.
MAX_INLINE_OUTPUTS_BYTES = 64 * 1024


@dataclass(frozen=True)
class EndedJob:
    """A succeeded job as committed, with the attributes `api.schemas.job_out` reads."""

    id: str
    model: str
    version: int
    priority: int
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime
    attempts: int
    worker: str
    outputs: bytes
    status: str = "succeeded"
    deadline_at: datetime | None = None  # its `Cancel-After`, as stored
    queue_timeout_at: datetime | None = None  # its `Queue-Timeout`, as stored
    samples: int = 0  # for its `usage`
    device_s: float | None = None  # its share of the batch's forward passes (its `usage`)
    error_code: None = None
    error_message: None = None

    def as_item(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "priority": self.priority,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "attempts": self.attempts,
            "worker": self.worker,
            "outputs": pybase64.b64encode(self.outputs).decode("ascii"),
            "deadline_at": _iso(self.deadline_at),
            "queue_timeout_at": _iso(self.queue_timeout_at),
            "samples": self.samples,
            "device_s": self.device_s,
        }

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> EndedJob:
        return cls(
            id=item["id"],
            model=item["model"],
            version=item["version"],
            priority=item["priority"],
            created_at=_parse(item["created_at"]),
            started_at=_parse(item["started_at"]),
            finished_at=datetime.fromisoformat(item["finished_at"]),
            attempts=item["attempts"],
            worker=item["worker"],
            outputs=pybase64.b64decode(item["outputs"]),
            deadline_at=_parse(item.get("deadline_at")),  # absent from an older worker's
            queue_timeout_at=_parse(item.get("queue_timeout_at")),  # likewise
            samples=int(item.get("samples") or 0),
            device_s=item.get("device_s"),
        )


_SIGNATURE_HEX = 64  # sha256


def _sign(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).hexdigest().encode()


def encode(ended: list[str | EndedJob], *, key: bytes) -> bytes:
    """`<hex HMAC of the payload> <payload>`: the payload is a JSON list of ids or jobs."""
    payload = orjson.dumps([e if isinstance(e, str) else e.as_item() for e in ended])
    return _sign(key, payload) + b" " + payload


def decode(
    message: bytes, *, key: bytes | None, wanted: Container[str] | None = None
) -> list[tuple[str, EndedJob | None]]:
    """(job id, the job when announced whole) per item; an item it cannot read is skipped.
    With `wanted`, only the jobs it holds are read whole (the others' ids only). A message not
    signed with `key` (or any message, without a key) gives ids only."""
    head, _, rest = message.partition(b" ")
    if len(head) == _SIGNATURE_HEX and rest:
        trusted = key is not None and hmac.compare_digest(head, _sign(key, rest))
        payload = rest
    else:  # a bare JSON list of ids (the sweeper's)
        trusted, payload = False, message
    try:
        items = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(items, list):
        return []
    out: list[tuple[str, EndedJob | None]] = []
    for item in items:
        if isinstance(item, str):
            out.append((item, None))
        elif isinstance(item, dict) and isinstance(job_id := item.get("id"), str):
            if not trusted or (wanted is not None and job_id not in wanted):
                out.append((job_id, None))
                continue
            try:
                out.append((job_id, EndedJob.from_item(item)))
            except (KeyError, TypeError, ValueError):  # from a newer or older worker
                out.append((job_id, None))
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _parse(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None
