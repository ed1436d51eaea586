"""When a job runs again, and when it never does: the worker's retry and attempt policy.

Every path by which a job runs again
------------------------------------
1. The database blinked. A statement of a batch (claim, top-up, result) raised one of
   `INFRA_ERRORS`: the batcher hands its leases back (`db.jobs.release`, running -> queued) where
   the database still answers, and re-raises; Celery retries the task with exponential back-off
   (`TASK_RETRY`: 1, 2, 4 ... `TASK_BACKOFF_MAX_S` apart, jittered, for as long as it takes).
   (worker/handoff.py `hand_back`, worker/tasks.py)
2. The child died mid-batch (SIGKILL, out of memory, a crash in TensorFlow, or the pool's
   `task_time_limit`). Redis redelivers its message (`task_acks_late`,
   `task_reject_on_worker_lost`: tffleet/broker.py). Its worker's main process sees it go and
   puts its jobs back to `queued` at once, publishing a wake-up each that goes before plain ones
   (`db.jobs.take_back_from`, worker/orphans.py, `PRIORITY_RETRY`). When the whole worker or its
   host died, nobody extends the leases: once they expire (`TFFLEET_LEASE_S`) the sweeper does
   the same (`db.jobs.expire_leases`, worker/sweeper.py).
3. The attempt budget. Each claim counts an attempt. A job taken back after its
   `TFFLEET_MAX_ATTEMPTS`-th claim (default 3) ends `failed` / `worker_lost` instead of going
   back: a job that kills its worker cannot loop forever (`db.jobs.take_back_from`,
   `db.jobs.expire_leases`).
4. Alone after a loss. A queued job with `attempts > budget_from` was claimed before in this run
   and did not end: it may be what went wrong, so it never shares a batch again in this run.
   Batches take only jobs never claimed in this run (`db.jobs.claim_next_fresh`); such a job runs
   alone (`db.jobs.claim_retried`, `Batcher.run`), and a job that crashes its child costs no
   other job an attempt. A client's retry (11) starts a new run: the job batches again.
5. A batch ran past its time limit (`timeout_s` in model.toml, else `TFFLEET_JOB_TIMEOUT_S`). A
   lone job fails `timeout`; the jobs of a larger batch are handed back and each runs alone (4), so
   only the slow one fails. The child then ends itself, as the forward pass holds the device
   (worker/timeouts.py).
6. The object store did not answer (`StoreUnavailable`) for a batch's inputs, or for a job's
   outputs too large for a row: as 1, the task is tried again with back-off, but those jobs go
   back to the queue as if never claimed (`db.jobs.unclaim`): no attempt spent, never failed for
   it (worker/objects.py). A transform's shard whose file or part the store does not serve goes
   back the same way, its part left unwritten (worker/transform.py); so does one running when
   the worker begins its warm shutdown, stopped at a batch boundary.
7. A wake-up was lost. (A submission that publishes none, as one for its version waits or a
   child waiting for more of its version heard of it, is not lost: docs/explanation/
   guarantees.md, "Wake-ups"; worker/linger.py. A child that dies between hearing and claiming
   leaves its jobs to the republish below.) The submit's publish fails fast
   (`PUBLISH_RETRY_POLICY` in tffleet/broker.py: the job is durable already), or Redis lost
   the message: the sweeper publishes again every queued job whose last wake-up is older than
   `TFFLEET_REPUBLISH_AFTER_S` (`db.jobs.stale_queued`).
8. A message reached a child that does not hold its version while another live child does: the
   child waits `HAND_BACK_PAUSE_S` and publishes the still-queued jobs again (`Child.turn_away`).
9. A message delivered twice (Redis's visibility timeout, a redelivery after 2) is harmless: a
   claim takes a queued job once, and results are fenced by the lease.
10. The client retries its own requests (`tffleet.client.protocol.Retries`) after a transport
   error, 429 or 503; a submit goes again under the same `Idempotency-Key`, so it never stores a
   second job.
11. A client asks for it: `POST /v1/jobs/{id}/retry` queues a failed or canceled job again under
   its id (`db.jobs.retry`), published as a new job is. `attempts` keeps counting; the attempt
   budget (3) counts only the claims since the retry (`budget_from`), and it batches with other
   jobs as a new one does until it is lost again (4).

What never runs again
---------------------
- A job's own fault: its forward pass raised (`model_error`; a batch that raises is split to find
  the job, so the others still succeed), its stored inputs do not unpack (`model_error`), no
  worker can load its version (`model_error`), it ran alone past its time limit (`timeout`). The
  same input would fail the same way.
- A transform's shard whose file is gone (`input_missing`), whose spec, location or file cannot
  be read as it says (`invalid_input`), or whose model raised on every record (`model_error`). A
  bad record never fails its shard: it goes to the shard's errors file (worker/transform.py).
- A job that used its attempt budget (`worker_lost`), and a canceled job, unless a client
  retries it (11).
- A job past its deadline (`Cancel-After`): the claim cancels it instead of starting it, and the
  sweeper cancels it if it is queued or running (`db.jobs.cancel_overdue`).
- A queued job that no worker started within its `Queue-Timeout`: the claim cancels it instead of
  starting it, and the sweeper cancels it if it is still queued (`db.jobs.cancel_unstarted`).
- Inputs that do not fit the model are refused at submit (422, `invalid_input`): no job is stored.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from tffleet.objectstore import StoreUnavailable

# Faults that are nobody's fault but the database's: hand the jobs back, retry the task.
# IntegrityError and the like are bugs, not blinks: they fail loudly instead.
INFRA_ERRORS = (OperationalError, InterfaceError)

# The longest pause between two tries of a task that met `INFRA_ERRORS` or `StoreUnavailable`.
TASK_BACKOFF_MAX_S = 30

# Celery's own retry of `run_batch` (its task options): 1, 2, 4 ... 30 s, jittered, no limit.
# The object store not answering is retried the same way (6): its jobs were put back already.
TASK_RETRY: dict[str, Any] = {
    "autoretry_for": (*INFRA_ERRORS, StoreUnavailable),
    "retry_backoff": True,
    "retry_backoff_max": TASK_BACKOFF_MAX_S,
    "retry_jitter": True,
    "max_retries": None,
}

# A child that gets a message for a version only another child holds waits this long before it
# publishes the jobs again, so that a message no idle child can run does not spin between them.
HAND_BACK_PAUSE_S = 0.1
