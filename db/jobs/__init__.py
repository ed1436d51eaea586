"""Every change of a job's state, a module per part of a job's life.

                     ┌──── release, expire_leases, take_back_from ────┐
                     ▼                                                 │
    create ──▶ queued ───claim───▶ running ───complete───▶ succeeded   │
                 │                   │ ├────────fail─────▶ failed      │
                 │                   │ ├──expire_leases──▶ failed      │
                 │                   │ │  take_back_from               │
                 │                   │ └───────────────────────────────┘
                 └──────cancel───────┴────────cancel─────▶ canceled
                 └──claim, cancel_overdue (deadline)──┴───────▶ canceled
                 └──claim, cancel_unstarted (queue_timeout)───▶ canceled

    failed, canceled ──retry──▶ queued
    succeeded, failed, canceled ──purge_finished (past their retention), delete──▶ deleted

- creation: `queued` rows, committed before any wake-up is published (the API).
- claims: a compare-and-set, queued -> running, that records a lease (owner, attempt, expiry)
  and counts an attempt; the tenants that wait take turns (fair share). A job claimed before
  runs alone (Isolation). Worker children.
- leases: `heartbeat` extends a lease while its batch runs; `complete`, `fail`, `release` write
  only where the lease still matches (owner and attempt), so a stale or duplicate worker cannot
  overwrite a result; `fail` ends it with a `JobErrorCode`, `release` hands it back to the queue
  after a fault that is not the job's; `reserve_storage` marks a job as owning objects before its
  worker writes them. `expire_leases` (the sweeper) takes back jobs whose lease
  ran out: `queued` again, or `failed` (`worker_lost`) once they used their attempt budget;
  `take_back_from` does the same at once for a child its worker saw die (its main process).
- control: `cancel`, any unfinished job; a running job's late result is then fenced out. A job
  with a deadline (`Cancel-After`) that has not ended by then is canceled the same way, with
  error `deadline`: by the claim that would start it, or by the sweeper (`cancel_overdue`). A
  queued job with a `Queue-Timeout` that no worker started by then likewise, with error
  `queue_timeout` (`cancel_unstarted`).
  `retry`: a failed or canceled job runs again under its id, with a fresh attempt budget;
  `remove` (delete): an ended job goes now, inputs, outputs and all (the API).
- sweep: `cancel_late` cancels jobs past their deadline or queue time-out, a chunk at a time;
  `stale_queued` and `mark_published` find and record lost wake-ups; `stamp_expiry` and
  `purge_finished` delete ended jobs past their retention, `purge_inputs` their inputs past
  TFFLEET_INPUT_TTL_S, sooner (the sweeper).
- reads: for the API and the workers; history: the lines a job's changes append to it.

The modules import one another one way only: `_common` (the tables, the predicates on a job's
state, the webhook record of ended jobs) and `history` under all of them; `reads`; `control`,
which reads a job first; `leases`; `claims`, which hands out leases and cancels overdue jobs;
`creation` and `sweep` (which cancels through `control`) beside them. Callers import the package
(`from db import jobs`) and patch a name where it is looked up: `jobs.complete` for a worker's
call, `db.jobs.claims` for the claim's own statements.

worker/retry.py maps which of these paths make a job run again.
"""

from __future__ import annotations

from db.jobs._common import JobGroups
from db.jobs.claims import claim, claim_next, claim_next_fresh, claim_retried, still_queued
from db.jobs.control import cancel, cancel_overdue, cancel_unstarted, remove, retry
from db.jobs.creation import NewJob, Submitted, create, create_idempotent
from db.jobs.history import HistoryEvent, history_of
from db.jobs.leases import (
    Lease,
    TakenBack,
    complete,
    expire_leases,
    fail,
    heartbeat,
    progress,
    release,
    reserve_storage,
    take_back_from,
    unclaim,
)
from db.jobs.reads import (
    count_queued,
    count_unfinished,
    fetch,
    get,
    get_many,
    has_unfinished,
    list_jobs,
    queued_ids,
    some_queued,
)
from db.jobs.sweep import (
    Late,
    cancel_late,
    mark_published,
    oldest_kept_inputs,
    purge_finished,
    purge_inputs,
    stale_queued,
    stamp_expiry,
)

__all__ = [
    "HistoryEvent",
    "JobGroups",
    "Late",
    "Lease",
    "NewJob",
    "Submitted",
    "TakenBack",
    "cancel",
    "cancel_late",
    "cancel_overdue",
    "cancel_unstarted",
    "claim",
    "claim_next",
    "claim_next_fresh",
    "claim_retried",
    "complete",
    "count_queued",
    "count_unfinished",
    "create",
    "create_idempotent",
    "expire_leases",
    "fail",
    "fetch",
    "get",
    "get_many",
    "has_unfinished",
    "heartbeat",
    "history_of",
    "list_jobs",
    "mark_published",
    "oldest_kept_inputs",
    "progress",
    "purge_finished",
    "purge_inputs",
    "queued_ids",
    "release",
    "remove",
    "reserve_storage",
    "retry",
    "some_queued",
    "stale_queued",
    "stamp_expiry",
    "still_queued",
    "take_back_from",
    "unclaim",
]
