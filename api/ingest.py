"""Submissions and polls, coalesced (see `api.coalesce`).

`Ingestor`: submissions that arrive together share one transaction and one broker message per
model version. It commits, then publishes, then answers: a wake-up never names a row that is not
committed, and a publish that fails leaves the jobs `queued` for the sweeper. A submission with
an Idempotency-Key that finds its jobs already stored publishes nothing.

`JobReader`: polls that arrive together share one `SELECT ... WHERE id IN (...)`.

Both show a queued job's `queue_position` and `eta_s` (`db.standing.place`: a statement per job,
or one per model version for many), read after the commit for a submission, through a read
session (on SQLite no write lock is taken for it); not for a submission that waits for its jobs
(`Submission.placed`), whose wait reads them again if they are still queued at its end.

What a plain submission costs the database: its INSERTs, one DELETE ... RETURNING that claims
the objects written ahead of it (if any; api/writeahead.py), the commit, and the position read.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Row
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from api.coalesce import Coalescer
from api.metrics import CACHE_LOOKUPS, JOBS_SUBMITTED, PUBLISH_FAILURES
from db import jobs, objects, standing
from db.models import Job, JobStatus
from db.recent import Recent
from db.standing import Standing
from db.views import job_out, standing_fields
from tffleet import tensors
from tffleet.announcements import EndedJob
from tffleet.broker import Publisher
from tffleet.errors import JobNotFound
from tffleet.objectstore import keys

JobDict = dict[str, Any]

log = logging.getLogger(__name__)

# An encoding of outputs for reads only: their stored blob (`tffleet.tensors.pack`) as it is, for
# an answer in .npz (api/routes/jobs.py), instead of JSON tensors.
BLOB = "blob"


def job_view(
    job: Job | Row[Any] | EndedJob, encoding: str, standing: Standing | None = None
) -> JobDict:
    """`job_out` of a job, or for `BLOB` the job with `outputs` as their blob (bytes) if it
    succeeded."""
    if encoding != BLOB:
        return job_out(job, encoding=encoding, standing=standing)
    out = job_out(job, with_outputs=False, standing=standing)
    if job.status == JobStatus.SUCCEEDED.value and job.outputs is not None:
        out["outputs"] = bytes(job.outputs)
    return out


@dataclass(frozen=True)
class Ingested:
    """One request's jobs as stored, in its order; `replayed` when an Idempotency-Key found them."""

    jobs: list[JobDict]
    replayed: bool = False


# A transaction holds at most 2048 jobs or 16 MiB of inputs (a request that alone is larger
# gets one of its own). Large submissions are then committed, published and run one after
# another, the worker reading one job's inputs while the API writes the next, instead of all
# of them waiting for one huge commit.
_MAX_UNITS = 2048
_BYTES_PER_UNIT = 8 * 1024


@dataclass(frozen=True)
class Submission:
    """One request's new jobs. `placed`: answered with where its queued jobs stand; False for a
    request that waits for its jobs (`POST ?wait=`), which reads them again if the wait ends
    with one still queued: the read is saved where they end within it."""

    new: Sequence[jobs.NewJob]
    placed: bool = True


def _units(request: Submission) -> int:
    return max(len(request.new), sum(len(job.inputs) for job in request.new) // _BYTES_PER_UNIT)


class Ingestor(Coalescer[Submission, Ingested]):
    """`await ingestor(Submission(new_jobs))` -> `Ingested`, or the error (409, say) to answer
    with.

    A request's jobs carry an idempotency key or none do. Keyed requests share the transaction
    through `db.jobs.create_idempotent`, which never fails one request for another's key.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        publisher: Publisher,
        recent: Recent | None = None,
        reads: sessionmaker[Session] | None = None,
    ) -> None:
        super().__init__(self._write, name="ingestor", max_batch=_MAX_UNITS, size=_units)
        self._sessions = sessions
        # Where the jobs stand is read through these (`reads`: on SQLite no write lock is taken
        # for it, as a write session's BEGIN IMMEDIATE would).
        self._reads = reads or sessions
        self._publisher = publisher
        self.recent = recent or Recent()

    def _write(self, submissions: Sequence[Submission]) -> list[Ingested | BaseException]:
        requests = [s.new for s in submissions]
        unplaced = {i for i, s in enumerate(submissions) if not s.placed}
        owned = {job.id: own for r in requests for job in r if (own := _own_keys(job))}
        try:
            return self._store(requests, owned, unplaced, claim_first=True)
        except _Late:  # rolled back: sorted out request by request (rare: a grace nearly over)
            return self._store(requests, owned, unplaced, claim_first=False)

    def _store(
        self,
        requests: Sequence[Sequence[jobs.NewJob]],
        owned: dict[str | None, list[str]],
        unplaced: set[int],
        *,
        claim_first: bool,
    ) -> list[Ingested | BaseException]:
        results: dict[int, Ingested | BaseException] = {}
        keyed = {i for i, r in enumerate(requests) if r and r[0].idempotency_key is not None}
        # Objects written ahead of their jobs (api/writeahead.py): a request whose garbage rows
        # are (nearly) due is refused, the sweeper may be deleting its objects. Those of plain
        # requests are claimed first, in one statement, unless one turns out late (then the
        # transaction rolls back and each request is checked before any is claimed); a keyed
        # request's only once it is known to store its jobs (not a replay).
        first = [k for i, r in enumerate(requests) if i not in keyed for k in _keys(r, owned)]
        checked = [k for i in keyed for k in _keys(requests[i], owned)]
        with self._sessions.begin() as session:
            if claim_first:
                if len(objects.claim_those_in_time(session=session, keys=first)) < len(set(first)):
                    raise _Late
            else:
                checked += first
            late = objects.late(session=session, keys=checked)
            for i, request in enumerate(requests):
                if any(key in late for key in _keys(request, owned)):
                    results[i] = objects.too_late(len(late))
            ordered = sorted(keyed - set(results))
            plain = sorted(set(range(len(requests))) - keyed - set(results))
            created = jobs.create(session=session, jobs=[j for i in plain for j in requests[i]])
            looked_up: list[Any] = [job for job in created if job.cache_key]
            stored: list[Any] = list(created)
            publish = [job_out(job, with_outputs=False) for job in created]
            start = 0
            for i in plain:
                results[i] = Ingested(publish[start : start + len(requests[i])])
                start += len(requests[i])
            claimed = len(publish) if claim_first else 0  # the jobs whose objects are claimed
            outcomes = (
                jobs.create_idempotent(session=session, requests=[requests[i] for i in ordered])
                if ordered
                else []
            )
            for i, outcome in zip(ordered, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    results[i] = outcome
                    continue
                outs = [job_out(j, with_outputs=False) for j in outcome.jobs]
                stored += outcome.jobs
                results[i] = Ingested(outs, replayed=outcome.replayed)
                new = set(outcome.created)
                publish += [out for out in outs if out["id"] in new]
                looked_up += [j for j in outcome.jobs if j.id in new and j.cache_key]
            made = [out["id"] for out in publish[claimed:]]  # the jobs created, less those claimed
            objects.claim(session=session, keys=[k for i in made for k in owned.get(i, ())])
        for job in looked_up:
            CACHE_LOOKUPS.labels(model=job.model, result="hit" if job.cached else "miss").inc()
        # After the commit: a wake-up never names a row another connection cannot see yet.
        wake: defaultdict[tuple[str, int], list[str]] = defaultdict(list)
        for out in publish:
            if out["cached"]:  # answered from the response cache: ended already
                continue
            wake[(out["model"], out["version"])].append(out["id"])
        for (model, version), ids in wake.items():
            JOBS_SUBMITTED.labels(model=model).inc(len(ids))
            if not self._publisher.publish(model=model, version=version, job_ids=ids, once=True):
                PUBLISH_FAILURES.inc()
        placed = [r for i, r in results.items() if isinstance(r, Ingested) and i not in unplaced]
        self._place(stored, placed)
        return [results[i] for i in range(len(requests))]

    def _place(self, stored: list[Any], answers: list[Ingested]) -> None:
        """Where the queued jobs of `answers` stand, read once they are committed and published
        (a worker that took one meanwhile leaves it with no position)."""
        shown = {out["id"] for answer in answers for out in answer.jobs}
        queued = [job for job in stored if job.status == JobStatus.QUEUED.value and job.id in shown]
        if not queued:
            return
        try:
            with self._reads() as session:
                placed = standing.place(
                    session=session, jobs=queued, recent=self.recent, together=True
                )
        except SQLAlchemyError as exc:
            # The jobs are stored and published: an error now would make a client that retries
            # without a key store them twice. They go without a position this once.
            log.warning("could not place %d submitted jobs in the queue (%s)", len(queued), exc)
            return
        for answer in answers:
            for out in answer.jobs:
                out.update(standing_fields(placed.get(out["id"])))


class Read(NamedTuple):
    """Job ids, the encoding of outputs, the tenant whose jobs they must be (None: anyone's),
    and whether queued ones are placed in their queue (`queue_position`, `eta_s`: a walk of it
    in the index, db/standing.py); unplaced, they show none."""

    ids: Sequence[str]
    encoding: str
    tenant: str | None
    placed: bool = True


class JobReader(Coalescer[Read, list[JobDict]]):
    """`await reader(Read(job_ids, encoding, tenant))` -> the jobs in that order, or JobNotFound
    (another tenant's job is not found)."""

    def __init__(self, reads: sessionmaker[Session], recent: Recent | None = None) -> None:
        super().__init__(self._read, name="job-reader", max_batch=4096, size=lambda r: len(r[0]))
        self._reads = reads
        self.recent = recent or Recent()

    def _read(self, requests: Sequence[Read]) -> list[list[JobDict] | BaseException]:
        # An id with NUL names no job, and PostgreSQL refuses NUL in a query: left out, it is
        # reported missing (404) like any unknown id.
        wanted = list({job_id for ids, *_ in requests for job_id in ids if "\x00" not in job_id})
        with self._reads() as session:
            rows = jobs.fetch(session=session, job_ids=wanted)
            # Only for jobs some request may see: another tenant's costs the caller nothing.
            visible = {
                job_id: row
                for ids, _, tenant, wanted_placed in requests
                if wanted_placed
                for job_id in ids
                if (row := rows.get(job_id)) is not None and tenant in (None, row.tenant)
            }
            placed = standing.place(
                session=session, jobs=list(visible.values()), recent=self.recent
            )
        result: list[list[JobDict] | BaseException] = []
        for ids, encoding, tenant, _ in requests:
            missing = [
                job_id
                for job_id in ids
                if job_id not in rows or (tenant is not None and rows[job_id].tenant != tenant)
            ]
            if missing:
                result.append(_not_found(missing))
            else:
                result.append(
                    [job_view(rows[job_id], encoding, placed.get(job_id)) for job_id in ids]
                )
        return result


class _Late(Exception):
    """A plain request's objects were late: `Ingestor._store` again, checking each request."""


def _keys(request: Sequence[jobs.NewJob], owned: dict[str | None, list[str]]) -> list[str]:
    return [key for job in request for key in owned.get(job.id, ())]


def _own_keys(job: jobs.NewJob) -> list[str]:
    """The objects a new job's inputs hold under its own prefix: written ahead of its row."""
    if job.stored_bytes is None or job.id is None:
        return []
    prefix = keys.job_prefix(job.tenant, job.id)
    found = tensors.references(job.inputs).values()
    return [ref.key for ref in found if ref.key.startswith(prefix)]


def _not_found(missing: Sequence[str]) -> JobNotFound:
    shown = ", ".join(repr(m) for m in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return JobNotFound(f"job {shown}{more} not found")
