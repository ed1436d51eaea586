"""A batch whose forward passes run past its time limit (`BatchPolicy.timeout_s`).

The child's heartbeat thread calls time on it (worker/heartbeat.py), while the batch cannot
finish. A lone job fails `timeout`; the jobs of a larger batch go back to the queue, where each
then runs alone (they were claimed before), so only the slow one fails. Then the child ends
itself (`end_process`): the stuck forward pass holds the device and cannot be interrupted from
Python. The worker's main process takes back the batches the child held in its other stages
(worker/orphans.py).
"""

from __future__ import annotations

import logging
import os

from sqlalchemy.orm import Session, sessionmaker

from db import jobs, parts
from db.models import JobErrorCode
from worker import metrics
from worker.announcer import Notify
from worker.handoff import Wake
from worker.heartbeat import Running
from worker.writer import parents

log = logging.getLogger(__name__)

# The exit status of a child that ended itself because a batch ran past its time limit.
TIMEOUT_EXIT_CODE = 75


def end_process() -> None:
    # A forward pass cannot be interrupted from Python, so the only way to free the device is to
    # end this process. Celery sees its child die, redelivers the message it was running
    # (task_reject_on_worker_lost), and starts a new child on the same pool index: the same device.
    os._exit(TIMEOUT_EXIT_CODE)


def end_batch(
    batch: Running, *, sessions: sessionmaker[Session], notify: Notify, wake: Wake
) -> None:
    """Fail a lone job `timeout`, or hand a larger batch's jobs back to run alone; announce or
    wake them once that commits. A database error is logged: the leases then expire and the
    sweeper takes the jobs back."""
    ids = batch.job_ids
    alone = len(ids) == 1
    log.error(
        "a batch of %d %s:%s jobs ran past its %gs time limit (%s); %s; ending this child, "
        "whose forward pass cannot be interrupted",
        len(ids), batch.model, batch.version, batch.timeout_s, ", ".join(ids),
        "it fails `timeout`" if alone else "they go back to the queue to run alone",
    )  # fmt: skip
    try:
        with sessions.begin() as session:
            if alone:
                jobs.fail(
                    session=session,
                    leases=batch.leases,
                    code=JobErrorCode.TIMEOUT,
                    message=f"the forward pass ran past the time limit of "
                    f"{batch.timeout_s:g}s (the model's timeout_s, or TFFLEET_JOB_TIMEOUT_S)",
                )
                ids += parts.settle(session=session, parent_ids=parents(batch.leases))
            else:
                jobs.release(session=session, leases=batch.leases)
    except Exception:
        log.exception(
            "could not record the time-out; the leases expire and the sweeper takes the jobs back"
        )
    else:
        if alone:
            metrics.JOBS_FINISHED.labels(batch.model, "failed").inc()
            notify(ids)
        else:
            wake(batch.model, batch.version, ids)
