"""The sweeper: no accepted job stays stuck. It never imports TensorFlow.

Each sweep
1. takes back expired leases (the worker died or hung): the job goes back to `queued` and is
   published again, or ends `failed` (`worker_lost`) once it has used its attempt budget;
2. publishes again the queued jobs whose last wake-up is older than `republish_after_s` (the
   submit's publish failed, or Redis lost the message);
3. deletes finished jobs older than `result_ttl_s`, and the model reports of worker children
   that died (db.presence); before that, the inputs of jobs that ended over `input_ttl_s` ago;
4. deletes response cache entries older than `cache_ttl_s`, then the oldest while all of them
   hold more than `cache_max_bytes` (db.cache), and the objects no row names (worker/garbage.py);
5. cancels queued and running jobs past their deadline (`Cancel-After`), and queued jobs not
   started within their `Queue-Timeout`, first of all: a claim never starts one, but a queued
   job no worker claims, or a running one, needs the sweeper.
6. every 10 minutes, folds the usage records of each hour that ended over an hour ago into a
   row per tenant and model (db.usage `fold`: a row per batch until then).

Only jobs of versions that some live worker child holds are published again: the others stay
queued, without a pile of wake-ups in their queue, until a child loads their version (it wakes
them itself) or comes back.

The same process delivers webhooks (worker/webhooks.py), on a thread and connections of its own,
in every sweeper process, the standbys too: a slow receiver never delays a sweep.

One sweeper is active across the fleet: it holds a Redis lock with a short expiry, which a thread
of its own extends every third of it (however long a sweep takes); the others stand by and take
over once it lapses, so a sweeper killed with its host is replaced within the expiry and an
interval, while the leases of that host's jobs run out. Every step is safe to repeat and to run
twice at once (the database changes are compare-and-sets, and a claim takes a job once), so a
lock that lapses in the middle of a sweep costs duplicate messages, never a job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Protocol

import redis
from prometheus_client import Counter, Gauge
from sqlalchemy.orm import Session, sessionmaker

from db import cache, jobs, parts, presence, usage
from db import clock as db_clock
from db.models import JobErrorCode
from tffleet.objectstore import ObjectStore, open_store
from tffleet.settings import Settings
from worker import garbage
from worker.announcer import Announcer
from worker.leadership import Leadership

log = logging.getLogger(__name__)

# Work per step of a sweep: chunks of this many jobs (one transaction each), at most this many
# chunks, so one sweep stays short and the next one goes on where it stopped.
CHUNK_JOBS = 1000
MAX_CHUNKS = 20
# usage_records are folded to a row per hour, tenant and model this often, for the hours that
# ended at least this long ago (no batch ends in them any more).
FOLD_USAGE_EVERY_S = 600.0
FOLD_USAGE_AFTER = timedelta(hours=1)
# A job's end commits moments after the time it records: each pass over ended jobs' inputs
# looks this far behind the last one's cutoff, so an end committed late is still found.
LATE_END = timedelta(minutes=1)

SWEPT = Counter("tffleet_sweeper_jobs_total", "Jobs the sweeper acted on", ["action"])
CACHE_PURGED = Counter(
    "tffleet_sweeper_cache_entries_purged_total",
    "Response cache entries past TFFLEET_CACHE_TTL_S or over TFFLEET_CACHE_MAX_BYTES",
)
PUBLISH_FAILURES = Counter(
    "tffleet_sweeper_publish_failures_total", "Wake-ups the broker did not take (retried later)"
)
SWEEP_ERRORS = Counter("tffleet_sweeper_errors_total", "Sweeps cut short by Redis or the database")
LAST_SWEEP = Gauge(
    "tffleet_sweeper_last_sweep_timestamp_seconds", "When this process last finished a sweep"
)


class Publisher(Protocol):
    """What the sweeper needs of `tffleet.broker.Publisher`."""

    def publish(
        self, *, model: str, version: int, job_ids: Sequence[str], retry: bool = False
    ) -> bool: ...


@dataclass
class SweepReport:
    requeued: int = 0  # expired leases put back in the queue
    worker_lost: int = 0  # expired leases that used their attempt budget: failed
    republished: int = 0  # job ids published again (requeued or stale), in `messages` messages
    messages: int = 0
    publish_failures: int = 0  # messages the broker did not take; their jobs stay stale
    purged: int = 0  # finished jobs deleted
    inputs_purged: int = 0  # ended jobs whose inputs were deleted (past TFFLEET_INPUT_TTL_S)
    deadline: int = 0  # queued or running jobs canceled past their deadline (`Cancel-After`)
    queue_timeout: int = 0  # queued jobs canceled, not started within their `Queue-Timeout`
    cache_purged: int = 0  # response cache entries deleted: past their age, or over the bound
    objects_deleted: int = 0  # objects deleted from the store (worker/garbage.py)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __bool__(self) -> bool:
        return any(self.as_dict().values())


def _chunks(ids: Sequence[str], size: int) -> list[Sequence[str]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


class Sweeper:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        publisher: Publisher,
        settings: Settings,
        redis_client: redis.Redis,
        *,
        clock: Callable[[Session], datetime] = db_clock.now,
    ) -> None:
        self._sessions = sessions
        self._publisher = publisher
        self._settings = settings
        # Bare ids (the sweeper holds no key): wakes the API's long-polls on jobs that ended.
        self._announce = Announcer(redis_client)
        self._clock = clock
        self._leadership = Leadership(redis_client, settings.sweep_interval_s)
        self._inputs_since: datetime | None = None  # where `_purge_inputs` goes on
        self._folded_at = float("-inf")  # when `_fold_usage` last ran
        self._store: ObjectStore | None = None  # opened at the first garbage (`_objects`)

    # Leadership (worker/leadership.py)

    @property
    def lock_timeout_s(self) -> float:
        return self._leadership.timeout_s

    def lead(self) -> bool:
        """True while this sweeper is the active one (taking or extending the lock); raises
        `redis.RedisError` when Redis cannot be reached."""
        return self._leadership.lead()

    def step_down(self) -> None:
        self._leadership.step_down()

    # The loop

    def run(self, stop: threading.Event) -> None:
        """Sweep every `sweep_interval_s` while this sweeper leads, until `stop` is set.

        Redis or the database going away is logged and retried with backoff; it never ends
        the loop.
        """
        interval = self._settings.sweep_interval_s
        max_backoff_s = max(interval, self.lock_timeout_s / 2)  # retry before the lock lapses
        failures = 0
        keeper = threading.Thread(
            target=self._leadership.keep, args=(stop,), name="sweeper-lock", daemon=True
        )
        keeper.start()
        try:
            while not stop.is_set():
                delay = interval
                try:
                    if self.lead():
                        self._log(self.sweep_once())
                    failures = 0
                except Exception as exc:  # redis, SQLAlchemy, kombu: all mean "try later"
                    failures += 1
                    delay = min(max_backoff_s, interval * 2 ** min(failures, 16))
                    SWEEP_ERRORS.inc()
                    log.warning(
                        "sweep failed (%s: %s); retrying in %.1fs",
                        type(exc).__name__,
                        exc,
                        delay,
                        exc_info=failures == 1,
                    )
                stop.wait(delay)
        finally:
            keeper.join()
            self.step_down()

    @staticmethod
    def _log(report: SweepReport) -> None:
        if report:
            log.info(
                "sweep: requeued %d, worker_lost %d, republished %d jobs in %d messages "
                "(%d messages failed), purged %d (inputs of %d more), cache entries purged %d, "
                "canceled past their deadline %d or queue time-out %d, objects deleted %d",
                report.requeued,
                report.worker_lost,
                report.republished,
                report.messages,
                report.publish_failures,
                report.purged,
                report.inputs_purged,
                report.cache_purged,
                report.deadline,
                report.queue_timeout,
                report.objects_deleted,
            )

    # One sweep

    def sweep_once(self) -> SweepReport:
        """One sweep. It does not check the lock: `run` calls it only while this sweeper leads."""
        report = SweepReport()
        self._cancel_overdue(report)  # before leases: a job past its deadline runs no more
        self._expire_leases(report)
        self._settle_split_jobs()
        if not report.publish_failures:  # the broker is away: leave the rest for the next sweep
            self._republish_stale(report)
        self._purge_inputs(report)
        self._purge(report)
        self._purge_cache(report)
        self._fold_usage()
        # After the purges, whose deleted rows leave their objects as garbage.
        report.objects_deleted += garbage.collect(self._sessions, self._objects).objects_deleted
        LAST_SWEEP.set_to_current_time()
        return report

    def _objects(self) -> ObjectStore:
        self._store = self._store or open_store(self._settings.object_store)
        return self._store

    def _expire_leases(self, report: SweepReport) -> None:
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                expired = jobs.expire_leases(
                    session=session,
                    now=self._clock(session),
                    max_attempts=self._settings.max_attempts,
                    limit=CHUNK_JOBS,
                )
            requeued = sum(len(ids) for ids in expired.requeued.values())
            report.requeued += requeued
            report.worker_lost += len(expired.failed)
            SWEPT.labels("requeued").inc(requeued)
            SWEPT.labels(JobErrorCode.WORKER_LOST.value).inc(len(expired.failed))
            if expired.failed:
                log.warning(
                    "%d jobs failed as worker_lost: %s", len(expired.failed), expired.failed
                )
                self._announce(expired.failed)
            # Committed first: if this publish is lost, the jobs are stale and step 2 finds them.
            self._publish(expired.requeued, report, retry=True)
            if expired.count < CHUNK_JOBS:
                return

    def _cancel_overdue(self, report: SweepReport) -> None:
        """Cancel queued and running jobs past their deadline (error `deadline`), and queued
        jobs not started within their queue time-out (`queue_timeout`): db.jobs.cancel_late."""
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                late = jobs.cancel_late(session=session, now=self._clock(session), limit=CHUNK_JOBS)
            report.deadline += len(late.deadline)
            report.queue_timeout += len(late.queue_timeout)
            for code, why, canceled in late.kinds():
                SWEPT.labels(code.value).inc(len(canceled))
                if canceled:
                    log.info("%d jobs canceled %s: %s", len(canceled), why, canceled)
                    self._announce(canceled)
            if not late.full(CHUNK_JOBS):
                return

    def _settle_split_jobs(self) -> None:
        """End split jobs whose part failed where no part's transaction settled them (the
        `worker_lost` just above, a time-out), and drop the parts of split jobs canceled."""
        with self._sessions.begin() as session:
            ended = parts.settle(session=session, parent_ids=parts.stranded(session=session))
        if ended:
            log.warning("%d split jobs ended with a failed part: %s", len(ended), ended)
            self._announce(ended)

    def _republish_stale(self, report: SweepReport) -> None:
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                now = self._clock(session)
                stale = jobs.stale_queued(
                    session=session,
                    older_than=now - timedelta(seconds=self._settings.republish_after_s),
                    limit=CHUNK_JOBS,
                    held_since=presence.live_since(self._settings.model_poll_s, now),
                )
            found = sum(len(ids) for ids in stale.values())
            if found:
                log.info("republishing %d queued jobs whose wake-up is overdue", found)
            # Published ones leave the stale set (mark_published), so the next chunk is new.
            if not self._publish(stale, report) or found < CHUNK_JOBS:
                return

    def _purge_cache(self, report: SweepReport) -> None:
        """Keep the response cache within TFFLEET_CACHE_TTL_S and TFFLEET_CACHE_MAX_BYTES."""
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                older_than = self._clock(session) - timedelta(seconds=self._settings.cache_ttl_s)
                purged = cache.purge(
                    session=session,
                    older_than=older_than,
                    max_bytes=self._settings.cache_max_bytes,
                    limit=CHUNK_JOBS,
                )
            report.cache_purged += purged
            CACHE_PURGED.inc(purged)
            if purged < CHUNK_JOBS:
                return

    def _fold_usage(self) -> None:
        """Every FOLD_USAGE_EVERY_S, usage_records down to a row per hour, tenant and model for
        the hours that ended over FOLD_USAGE_AFTER ago (db/usage.py `fold`)."""
        if time.monotonic() - self._folded_at < FOLD_USAGE_EVERY_S:
            return
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                before = self._clock(session) - FOLD_USAGE_AFTER
                if not usage.fold(session=session, before=before):
                    break
        self._folded_at = time.monotonic()

    def _purge_inputs(self, report: SweepReport) -> None:
        """Delete the inputs of jobs that ended over TFFLEET_INPUT_TTL_S ago, in chunks from where
        the last one stopped (after a start: the earliest kept), so no sweep rereads them all."""
        with self._sessions() as session:
            cutoff = self._clock(session) - timedelta(seconds=self._settings.input_ttl_s)
            if self._inputs_since is None:
                self._inputs_since = jobs.oldest_kept_inputs(session=session) or cutoff - LATE_END
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                purged = jobs.purge_inputs(
                    session=session, since=self._inputs_since, older_than=cutoff, limit=CHUNK_JOBS
                )
            report.inputs_purged += purged.deleted
            SWEPT.labels("inputs_purged").inc(purged.deleted)
            if purged.deleted < CHUNK_JOBS:
                self._inputs_since = max(self._inputs_since, cutoff - LATE_END)
                return
            self._inputs_since = purged.reached or self._inputs_since

    def _purge(self, report: SweepReport) -> None:
        with self._sessions() as session:
            now = self._clock(session)
        cutoff = now - timedelta(seconds=self._settings.result_ttl_s)
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                if jobs.stamp_expiry(session=session, limit=CHUNK_JOBS) < CHUNK_JOBS:
                    break
        for _ in range(MAX_CHUNKS):
            with self._sessions.begin() as session:
                purged = jobs.purge_finished(
                    session=session, older_than=cutoff, limit=CHUNK_JOBS, now=now
                )
            report.purged += purged
            SWEPT.labels("purged").inc(purged)
            if purged < CHUNK_JOBS:
                break
        with self._sessions.begin() as session:
            presence.purge_dead(
                session=session, before=presence.live_since(self._settings.model_poll_s, now)
            )

    def _publish(self, groups: jobs.JobGroups, report: SweepReport, *, retry: bool = False) -> bool:
        """Publish each group in messages of at most `max_batch_size` ids; False if one failed.
        `retry`: jobs taken back from a worker, whose wake-ups go first."""
        with self._sessions() as session:
            at = self._clock(session)
        published: list[str] = []
        ok = True
        for (model, version), ids in groups.items():
            for chunk in _chunks(ids, self._settings.max_batch_size):
                if not self._publisher.publish(
                    model=model, version=version, job_ids=chunk, retry=retry
                ):
                    ok = False
                    report.publish_failures += 1
                    PUBLISH_FAILURES.inc()
                    break
                published += chunk
                report.messages += 1
            if not ok:  # the broker is away; the rest would only wait for the same timeout
                break
        if published:
            with self._sessions.begin() as session:
                jobs.mark_published(session=session, job_ids=published, at=at)
            report.republished += len(published)
            SWEPT.labels("republished").inc(len(published))
        return ok
