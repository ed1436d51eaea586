"""Reading jobs and waiting for them, as plans (see `tffleet.client.protocol`) both clients
drive: one job or many, read at once or long-polled (`wait`, `wait_all`), and the bar a long
wait shows."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import orjson
from tqdm import tqdm

from tffleet.client.errors import InvalidInput, ProtocolError, WaitTimeout
from tffleet.client.job import Job
from tffleet.client.objects import read_job
from tffleet.client.protocol import ACCEPT_NPZ, Call, Plan, Retries, Sleep, send

MAX_POLL_S = 30.0  # the longest `wait` the API holds a request for
IDS_PER_STATUS_READ = 1_000
MIN_ROUND_S = 0.05  # between polling rounds that found jobs unfinished: completions batch up
# `wait_all`'s rounds: each answer costs the API a read of every job still pending, and each job
# that ended since, a fetch of its outputs; so while many are pending, completions gather a
# little longer (16 pending: 0.21 s), never past MAX_ROUND_S.
ROUND_S_PER_PENDING = 0.01
MAX_ROUND_S = 0.25
# A wait with a bar holds a round this long at most, so that the bar moves while jobs run.
PROGRESS_ROUND_S = 1.0
AUTO_PROGRESS_MIN_JOBS = 100


def get(job_id: str, *, encoding: str, wait_s: float, retries: Retries) -> Plan[Job]:
    """One job; with binary outputs asked for (`b64`), a job that has succeeded comes back as an
    .npz of its outputs."""
    params = {"encoding": encoding}
    if wait_s > 0:
        params["wait"] = f"{wait_s:.3f}"
    headers = {"Accept": ACCEPT_NPZ} if encoding == "b64" else None
    path = f"/v1/jobs/{quote(job_id, safe='')}"
    call = Call("GET", path, params=params, headers=headers, wait_s=wait_s)
    return (yield from read_job((yield from send(call, retries)), retries=retries))


def get_many(
    job_ids: Sequence[str], *, encoding: str, wait_s: float, retries: Retries
) -> Plan[list[Job]]:
    """The jobs, in the order given. With `wait_s`, held until one of the first
    `IDS_PER_STATUS_READ` unfinished ones ends; the rest are read as they are."""
    found: dict[str, Job] = {}
    unique = list(dict.fromkeys(job_ids))
    for start in range(0, len(unique), IDS_PER_STATUS_READ):
        ids = unique[start : start + IDS_PER_STATUS_READ]
        held = wait_s if start == 0 else 0.0
        for job in (yield from _status(ids, encoding=encoding, wait_s=held, retries=retries)):
            found[job.id] = job
    try:
        return [found[job_id] for job_id in job_ids]
    except KeyError as exc:
        raise ProtocolError(f"job {exc} missing from the status answer") from None


def _status(
    ids: Sequence[str],
    *,
    encoding: str,
    wait_s: float,
    retries: Retries,
    until: str | None = None,
) -> Plan[list[Job]]:
    """One `POST /v1/jobs/status` of at most `IDS_PER_STATUS_READ` distinct ids, held up to
    `wait_s` until one of them ends (`until="all"`: until every one has)."""
    body: dict[str, Any] = {"ids": list(ids), "encoding": encoding, "wait": round(wait_s, 3)}
    if until is not None:
        body["until"] = until
    call = Call("POST", "/v1/jobs/status", content=orjson.dumps(body))
    data = yield from send(call, retries)
    try:
        wire = list(data["jobs"])
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"not a status answer: {exc!r}") from None
    jobs = []
    for item in wire:
        jobs.append((yield from read_job(item, retries=retries)))
    return jobs


def wait(job_id: str, *, timeout: float | None, retries: Retries) -> Plan[Job]:
    """Long-poll in rounds of up to `MAX_POLL_S` until the job finishes or `timeout` passes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        started = time.monotonic()
        job = yield from get(job_id, encoding="b64", wait_s=hold_s(deadline), retries=retries)
        if job.finished:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"job {job_id} still {job.status} after {timeout} s", jobs=[job])
        yield from _pause(started, deadline)


def wait_all(
    job_ids: Sequence[str], *, timeout: float | None, progress: bool | None, retries: Retries
) -> Plan[list[Job]]:
    """Wait for every job; each round re-reads only those still unfinished, so each job's
    outputs come over once. Returns them in the order given.

    A round holds the first `IDS_PER_STATUS_READ` pending jobs in the order given (the oldest
    first, as `submit_many` returns them) until every one of them has ended (`until: "all"`),
    and reads no others: a tenant's queue runs oldest first, so each job is read about once,
    the next ones run while the last are read, and the last answer comes as the last job
    ends. An API from before `until` answers as soon as one of the held jobs ends; its rounds
    are paced instead, and read every pending job."""
    deadline = None if timeout is None else time.monotonic() + timeout
    latest: dict[str, Job] = {}
    pending = list(dict.fromkeys(job_ids))
    until: str | None = "all"
    with progress_bar(progress, len(pending), "wait", bar_format=WAIT_BAR_FORMAT) as bar:
        while pending:
            started = time.monotonic()
            held = pending[:IDS_PER_STATUS_READ] if until else pending
            wait_s = hold_s(deadline, PROGRESS_ROUND_S if not bar.disable else MAX_POLL_S)
            try:
                if until:
                    jobs = yield from _status(
                        held, encoding="b64", wait_s=wait_s, until=until, retries=retries
                    )
                else:
                    jobs = yield from get_many(held, encoding="b64", wait_s=wait_s, retries=retries)
            except InvalidInput as exc:
                if until is None or "until:" not in str(exc):
                    raise
                until = None
                continue
            latest.update((job.id, job) for job in jobs)
            still = {job.id for job in jobs if not job.finished}
            bar.update(len(held) - len(still))
            failed = sum(1 for job in latest.values() if job.finished and not job.ok)
            if failed:
                bar.set_postfix(failed=failed, refresh=False)
            # Each id once, in the order given: the first are the next round's held ones.
            done = {job.id for job in jobs} - still
            pending = [job_id for job_id in pending if job_id not in done]
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                yield from _timed_out(job_ids, latest, pending, timeout=timeout, retries=retries)
            if until is None or still.intersection(held):
                # Answered before all the held jobs ended (an old API, one past its limit of
                # held requests, or the bar's round): completions gather before the next round.
                yield from _pause(started, deadline, round_s=_gather_s(len(pending)))
    return [latest[job_id] for job_id in job_ids]


def _timed_out(
    job_ids: Sequence[str],
    latest: dict[str, Job],
    pending: list[str],
    *,
    timeout: float | None,
    retries: Retries,
) -> Plan[None]:
    """Raise `WaitTimeout` with every job as last seen, in the order given: those no round
    held, read now."""
    unread = [job_id for job_id in pending if job_id not in latest]
    if unread:
        jobs = yield from get_many(unread, encoding="b64", wait_s=0, retries=retries)
        latest.update((job.id, job) for job in jobs)
    unfinished = sum(1 for job in latest.values() if not job.finished)
    raise WaitTimeout(
        f"{unfinished} of {len(latest)} jobs unfinished after {timeout} s",
        jobs=[latest[job_id] for job_id in job_ids],
    )


def hold_s(deadline: float | None, most_s: float = MAX_POLL_S) -> float:
    """How long a round may hold a request: `most_s`, or less where `deadline` comes first."""
    if deadline is None:
        return most_s
    return max(0.0, min(most_s, deadline - time.monotonic()))


def _gather_s(pending: int) -> float:
    return min(MAX_ROUND_S, MIN_ROUND_S + ROUND_S_PER_PENDING * pending)


def _pause(started: float, deadline: float | None, round_s: float = MIN_ROUND_S) -> Plan[None]:
    """Not before `round_s` since the round began: a server that answers at once (an old one,
    or one finishing jobs one by one) is not polled in a tight loop."""
    until = started + round_s
    if deadline is not None:
        until = min(until, deadline)
    left = until - time.monotonic()
    if left > 0:
        yield Sleep(left)


# `wait_all`'s bar: counts and the time waited, no rate. Its count grows by the jobs each poll
# finds ended, which ended while earlier rounds waited or before the wait began: a rate of
# results collected ("19850.45job/s" for jobs long done) says nothing of how fast jobs run.
WAIT_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} ended [{elapsed}{postfix}]"


def progress_bar(
    progress: bool | None, total: int | None, what: str, *, bar_format: str | None = None
) -> tqdm[Any]:
    """`progress` True or False; None: shown for many jobs when stderr is a terminal."""
    if progress is None:
        progress = (total or 0) > AUTO_PROGRESS_MIN_JOBS and sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=what,
        unit="job",
        disable=not progress,
        dynamic_ncols=True,
        bar_format=bar_format,
    )
