"""Transforms over files (DESIGN §14) as plans both clients drive (see `tffleet.client.protocol`).

A transform runs a model over every record of files the fleet may read (`tffleet://datasets/...`,
or `file://` and `s3://` prefixes its operator allows) and writes output parts beside them. The
client never touches those stores: it creates the transform (`POST /v1/transforms`), follows
its counts (`GET /v1/transforms/{id}?wait=`, with a bar on records), steers it (cancel, retry)
and reads its output files back through the API (`GET /v1/transforms/{id}/files[/{name}]`).
`Transform` is a transform as the API last showed it; the handles of `tffleet.client.handles`
bind one to a client.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tqdm import tqdm

from tffleet.client.errors import ProtocolError, WaitTimeout
from tffleet.client.plans import dumps, new_idempotency_key
from tffleet.client.protocol import Call, Plan, Retries, Sleep, Stream, send
from tffleet.client.waiting import MAX_POLL_S, MIN_ROUND_S, PROGRESS_ROUND_S, hold_s

# The statuses a transform never leaves.
FINISHED = frozenset({"succeeded", "failed", "canceled"})
# The bar: records done of all, the time waited, and the API's counts and ETA; no rate of its
# own, which would count records done before the wait began as done in its first instant.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rec [{elapsed}{postfix}]"


@dataclass(frozen=True)
class Transform:
    """A transform as the API last showed it. `records_failed` counts bad records (listed in
    its errors files); a transform with some still `succeeded`. `failed` status: a shard
    failed for good (`retry` runs those again). `progress` is 0 to 1, `eta_s` an estimate."""

    id: str
    status: str  # queued, running, succeeded, failed, canceled
    model: str
    version: int
    records: int
    records_succeeded: int
    records_failed: int
    shards_total: int
    shards_done: int
    shards_failed: int
    progress: float | None
    eta_s: float | None
    output_uri: str
    output_format: str
    files: list[str]  # its output parts as the API lists them (empty until some are written)
    errors_uri: str | None
    created_at: datetime
    finished_at: datetime | None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    @property
    def records_done(self) -> int:
        return self.records_succeeded + self.records_failed

    def to_dict(self) -> dict[str, Any]:
        """The transform's JSON as the API gave it."""
        return dict(self.raw)

    @classmethod
    def from_wire(cls, data: Any) -> Transform:
        try:
            counts, shards, output = data["counts"], data["shards"], data["output"]
            return cls(
                id=str(data["id"]),
                status=str(data["status"]),
                model=str(data["model"]),
                version=int(data["version"]),
                records=int(counts["records"]),
                records_succeeded=int(counts["succeeded"]),
                records_failed=int(counts["failed"]),
                shards_total=int(shards["total"]),
                shards_done=int(shards["done"]),
                shards_failed=int(shards["failed"]),
                progress=_float(data.get("progress")),
                eta_s=_float(data.get("eta_s")),
                output_uri=str(output["uri"]),
                output_format=str(output["format"]),
                files=[str(f) for f in output.get("files") or []],
                errors_uri=data.get("errors_uri"),
                created_at=datetime.fromisoformat(data["created_at"]),
                finished_at=_datetime(data.get("finished_at")),
                raw=dict(data),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"not a transform: {exc!r} in {str(data)[:200]}") from None


def transform_body(
    model: str,
    input: str | Sequence[str],
    output: str | None,
    *,
    format: str | None,
    input_format: str | None,
    columns: Mapping[str, str] | None,
    key: str | None,
    version: int | None,
    shard_records: int | None,
    priority: int | None,
    webhook: str | None,
    webhook_events: Sequence[str] | None,
) -> dict[str, Any]:
    """`POST /v1/transforms`'s body, with only what the caller gave: the API's defaults are the
    API's (the input's format from its files' names, the output under
    `tffleet://transforms/<id>/`, its shard size and a priority below interactive jobs)."""
    source: dict[str, Any] = {"uri": input if isinstance(input, str) else list(input)}
    _put(source, "format", input_format)
    _put(source, "columns", dict(columns) if columns is not None else None)
    _put(source, "key", key)
    target: dict[str, Any] = {}
    _put(target, "uri", output)
    _put(target, "format", format)
    body: dict[str, Any] = {"model": model, "input": source, "output": target}
    for name, value in (
        ("version", version),
        ("shard_records", shard_records),
        ("priority", priority),
        ("webhook", webhook),
        ("webhook_events", list(webhook_events) if webhook_events is not None else None),
    ):
        _put(body, name, value)
    return body


def _put(into: dict[str, Any], name: str, value: Any) -> None:
    if value is not None:
        into[name] = value


def create(
    body: dict[str, Any], *, idempotency_key: str | None, retries: Retries
) -> Plan[Transform]:
    """Create one transform. Its `Idempotency-Key` (a fresh one if None) makes a create sent
    again after a lost answer the same transform, where the API keeps keys."""
    headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
    call = Call("POST", "/v1/transforms", content=dumps(body), headers=headers)
    return Transform.from_wire((yield from send(call, retries)))


def _path(transform_id: str, *rest: str) -> str:
    return "/".join(["/v1/transforms", quote(transform_id, safe=""), *rest])


def get(transform_id: str, *, wait_s: float, retries: Retries) -> Plan[Transform]:
    params = {"wait": f"{wait_s:.3f}"} if wait_s > 0 else None
    call = Call("GET", _path(transform_id), params=params, wait_s=wait_s)
    return Transform.from_wire((yield from send(call, retries)))


def wait(
    transform_id: str, *, timeout: float | None, progress: bool | None, retries: Retries
) -> Plan[Transform]:
    """Long-poll until the transform has ended or `timeout` passes (`WaitTimeout`, with the
    transform as last seen in `.transform`). With a bar (`progress`; None: on a terminal), in
    rounds of `PROGRESS_ROUND_S` so that it moves: records done of all, bad records and shards
    beside it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    bar: tqdm[Any] | None = None
    try:
        while True:
            started = time.monotonic()
            round_s = hold_s(deadline, PROGRESS_ROUND_S if progress is not False else MAX_POLL_S)
            seen = yield from get(transform_id, wait_s=round_s, retries=retries)
            bar = _show(bar, seen, progress)
            if seen.finished:
                return seen
            if deadline is not None and time.monotonic() >= deadline:
                raise TransformWaitTimeout(seen, timeout)
            left = started + MIN_ROUND_S - time.monotonic()
            if left > 0:
                yield Sleep(left)
    finally:
        if bar is not None:
            bar.close()


class TransformWaitTimeout(WaitTimeout):
    """A transform still unfinished when the wait ran out; `.transform` is it as last seen."""

    def __init__(self, transform: Transform, timeout: float | None) -> None:
        super().__init__(
            f"transform {transform.id} still {transform.status} after {timeout} s "
            f"({transform.records_done} of {transform.records} records)",
            jobs=[],
        )
        self.transform = transform


def _show(bar: tqdm[Any] | None, seen: Transform, progress: bool | None) -> tqdm[Any]:
    """The bar on records: made at the first answer (its total is the transform's records)."""
    if bar is None:
        shown = sys.stderr.isatty() if progress is None else progress
        bar = tqdm(
            total=seen.records,
            desc=f"transform {seen.id[:8]}",
            unit="rec",
            unit_scale=seen.records >= 100_000,  # 1.2M rec, not 1200000; 10/10 as it is
            disable=not shown,
            dynamic_ncols=True,
            bar_format=BAR_FORMAT,
        )
    done = _records_done(seen)
    if done > bar.n:
        bar.update(done - bar.n)
    shown_eta = {} if seen.finished or seen.eta_s is None else {"eta": f"{seen.eta_s:.0f}s"}
    bar.set_postfix(
        status=seen.status,
        failed=seen.records_failed,
        shards=f"{seen.shards_done}/{seen.shards_total}",
        **shown_eta,
        refresh=True,
    )
    return bar


def _records_done(seen: Transform) -> int:
    """Records done, running shards' included where the API's `progress` counts them."""
    done = seen.records_done
    if seen.progress is not None:
        done = max(done, int(seen.progress * seen.records))
    return min(done, seen.records)


def cancel(transform_id: str, *, retries: Retries) -> Plan[Transform]:
    call = Call("POST", _path(transform_id, "cancel"))
    return Transform.from_wire((yield from send(call, retries)))


def retry(transform_id: str, *, retries: Retries) -> Plan[Transform]:
    call = Call("POST", _path(transform_id, "retry"))
    return Transform.from_wire((yield from send(call, retries)))


def list_transforms(
    *, status: str | None, model: str | None, limit: int, retries: Retries
) -> Plan[list[Transform]]:
    """The tenant's transforms, newest first, `limit` at most, following the cursor."""
    found: list[Transform] = []
    cursor: str | None = None
    while len(found) < limit:
        params = {"limit": str(min(100, limit - len(found)))}
        for name, value in (("status", status), ("model", model), ("cursor", cursor)):
            if value is not None:
                params[name] = value
        data = yield from send(Call("GET", "/v1/transforms", params=params), retries)
        try:
            found += [Transform.from_wire(item) for item in data["transforms"]]
            cursor = data.get("next_cursor")
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"not a transform list: {exc!r}") from None
        if not cursor:
            break
    return found[:limit]


DATASETS_URI = "tffleet://datasets/"
CHUNK_BYTES = 1024 * 1024  # what one chunk of a dataset's body holds


def put_dataset(
    source: str | os.PathLike[str] | bytes,
    path: str,
    *,
    overwrite: bool,
    progress: bool | None,
    retries: Retries,
) -> Plan[str]:
    """`PUT /v1/datasets/{path}`: a file (or bytes) into the fleet's store for transforms to
    read; `path` is `a/b.csv` or `tffleet://datasets/a/b.csv`. Returns its URI. A file is
    streamed from disk in chunks, read afresh at each try, never held whole."""
    if path.startswith(DATASETS_URI):
        path = path[len(DATASETS_URI) :]
    elif "://" in path:
        raise ValueError(f"{path}: a dataset is put at tffleet://datasets/<path> (or <path>)")
    if isinstance(source, bytes):
        data = memoryview(source)
        length = len(data)

        def pieces() -> Iterator[bytes | memoryview]:
            for at in range(0, length, CHUNK_BYTES):
                yield data[at : at + CHUNK_BYTES]
    else:
        file = Path(source)
        length = file.stat().st_size

        def pieces() -> Iterator[bytes | memoryview]:
            with file.open("rb") as handle:
                while chunk := handle.read(CHUNK_BYTES):
                    yield chunk

    shown = (length >= 64 * 1024 * 1024 and sys.stderr.isatty()) if progress is None else progress
    with tqdm(
        total=length, desc="put", unit="B", unit_scale=True, unit_divisor=1024, disable=not shown
    ) as bar:

        def chunks() -> Iterator[bytes | memoryview]:
            bar.reset(total=length)  # a try after a failed one counts again
            for piece in pieces():
                yield piece
                bar.update(len(piece))

        call = Call(
            "PUT",
            f"/v1/datasets/{quote(path, safe='/')}",
            params={"overwrite": "true"} if overwrite else None,
            headers={"Content-Type": "application/octet-stream"},
            stream=Stream(length=length, chunks=chunks),
        )
        answer = yield from send(call, retries)
    try:
        return str(answer["uri"])
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"not a dataset: {exc!r} in {str(answer)[:200]}") from None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _datetime(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None
