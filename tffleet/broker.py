"""The broker contract between the API and the workers: the one module both services import.

What travels through Redis is a wake-up, never a job: a message names the task `run_batch`, a
model version and job ids whose rows are already committed (JSON only). A message can be lost,
repeated or late; the database, not the message, says what runs (docs/explanation/guarantees.md).

    api (Ingestor) ──Publisher.publish──▶ queue `tffleet.<model>` ──▶ worker child: run_batch
    sweeper, worker child (hand-backs) ──Publisher.publish──┘

Here: the task's name and argument order, the queue per model, the Celery app factory with the
settings durability depends on, and the publisher. No Celery app is built at import: the API
builds one in its lifespan, the worker in `worker.app`.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence

import orjson
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry

from tffleet.redis_urls import celery_broker, celery_redis_client
from tffleet.settings import Settings

log = logging.getLogger(__name__)

# The one task: run_batch(model: str, version: int, job_ids: list[str]) (worker/tasks.py).
RUN_BATCH_TASK = "tffleet.run_batch"
QUEUE_PREFIX = "tffleet."
# What a worker consumes when its repository has no model, so that it still starts.
DEFAULT_QUEUE = f"{QUEUE_PREFIX}default"

# Wake-ups for jobs that ran before and were taken back (their worker died, or the database
# failed under them) jump the queue: with a backlog, a plain wake-up waits behind every message
# published before it, while these jobs already waited their turn once. Redis delivers the lower
# number first (kombu's Redis transport keeps one list per priority step, 0, 3, 6, 9, and BRPOPs
# them in that order); messages published before this existed sit in step 0 and stay first.
PRIORITY_WAKE = 3
PRIORITY_RETRY = 0
_PRIORITY_SEP = "\x06\x16"  # kombu's: the list of step N > 0 is named queue + sep + N

# Fail fast when Redis is away: the job is already durable and the sweeper republishes it.
PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}
# How long a Redis call may take, for the worker (its BRPOP polls every second, well inside it)
# and for a process that only publishes: a Redis that stops answering (not refusing: hung) then
# costs a submission about a second, not forever.
SOCKET_TIMEOUT_S = 5.0
PUBLISH_SOCKET_TIMEOUT_S = 0.4
# After a failed publish, the next ones within this time fail at once without trying: a dead or
# hung Redis costs one submission its timeouts, not every submission.
PUBLISH_BACKOFF_S = 1.0

# `publish(once=True)` always pushes a message naming more jobs than this: its task shares them
# out among the idle children at once (worker/handoff.py `share`), which only a message can do.
ONCE_MAX_JOBS = 16
# A wake-up names its model version in this header too, where the script below can see it.
VERSION_HEADER = "tffleet_version"
# A wake-up of fresh jobs: tell a child whose task waits for more jobs of this model version (on
# its `fresh_channel`, worker/linger.py), then push the message. With ARGV[3] == '1' (`once`),
# push none when such a child heard (it claims the jobs itself), or when the newest message
# waiting in the list already wakes the same model version: that one is still to be taken, so
# its task claims after these jobs were committed (docs/explanation/guarantees.md, "Wake-ups").
# Returns HEARD, PUSHED or 0 (neither).
HEARD, PUSHED = 2, 1
_WAKE = """
local heard = redis.call('PUBLISH', KEYS[2], '1') > 0
if ARGV[3] == '1' then
    if heard then
        return 2
    end
    local newest = redis.call('LINDEX', KEYS[1], 0)
    if newest and string.find(newest, ARGV[2], 1, true) then
        return 0
    end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
return 1
"""


def queue_for(model: str) -> str:
    """One queue per model, so a worker can serve a subset of the fleet's models."""
    return f"{QUEUE_PREFIX}{model}"


def fresh_channel(model: str, version: int) -> str:
    """Where `publish(once=True)` tells a child waiting for fresh jobs of this model version
    that some were committed (worker/linger.py)."""
    return f"tffleet:fresh:{model}:{version}"  # as the other channels are named (constants.py)


def queue_lists(queue: str) -> list[str]:
    """The Redis lists that hold a queue's messages, in the order workers take them."""
    return [wake_up_list(queue, PRIORITY_RETRY), wake_up_list(queue, PRIORITY_WAKE)]


def wake_up_list(queue: str, priority: int) -> str:
    """The Redis list kombu's Redis transport keeps a queue's messages of `priority` in: step 0
    is the queue's own name, steps 3, 6, 9 the name + separator + step."""
    step = max(s for s in (0, 3, 6, 9) if s <= max(priority, 0))
    return f"{queue}{_PRIORITY_SEP}{step}" if step else queue


def make_celery(
    settings: Settings, *, include: Iterable[str] = (), socket_timeout_s: float = SOCKET_TIMEOUT_S
) -> Celery:
    """A Celery app on the fleet's broker; `include` names the modules that define tasks (the
    worker's), none for an app that only publishes (which passes PUBLISH_SOCKET_TIMEOUT_S)."""
    # A sentinel:// URL: kombu's form of it, and the master's name in the transport options.
    broker_url, sentinel_options = celery_broker(
        settings.broker_url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
    )
    app = Celery("tffleet", broker=broker_url, include=list(include))
    app.conf.update(
        # JSON only: a pickled message is refused, never executed.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        # Results live in the database; Celery keeps none.
        task_ignore_result=True,
        result_backend=None,
        # A message is acknowledged after its batch is written, and redelivered if the child dies.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # A child loads and warms its models in worker_process_init; Celery must wait for it.
        worker_proc_alive_timeout=settings.model_load_timeout_s,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": socket_timeout_s,
            **sentinel_options,
        },
        broker_connection_timeout=socket_timeout_s,
        # A batch's own time limit (job_timeout_s) is kept by the child itself, which then ends
        # (worker/batching.py). This is the last resort for a child stuck anywhere else (a
        # database call that never returns): the pool kills it once Redis would hand its
        # message to another worker anyway; its leases expire and the sweeper retries the jobs.
        task_time_limit=settings.visibility_timeout_s,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_default_queue=DEFAULT_QUEUE,
        worker_hijack_root_logger=False,
        # Task events cost the main process about as much as the task itself; Flower switches
        # them on when it connects (its `enable_events`), so they are off until someone looks.
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


class Publisher:
    """Wakes workers: publishes job ids to their model's queue, after their rows are committed.

    A wake-up is Celery's own task message (protocol 2, its headers and body made by Celery's
    `amqp.as_task_v2`), in the envelope kombu's Redis transport stores, pushed with one LPUSH on
    the list that transport would push it to (`wake_up_list`): what `send_task` writes, without
    its routing, queue declaring and producer pool per message (0.43 ms of CPU per publish, 0.05
    ms here; a Celery worker cannot tell the two apart). Through its own Redis client, with the
    app's socket timeouts and one retry at once (as PUBLISH_RETRY_POLICY says for `send_task`);
    thread-safe, and safe across a fork (redis-py's pool reconnects in a new process).
    """

    def __init__(self, celery: Celery) -> None:
        self._celery = celery
        self._failed_at = -float("inf")  # time.monotonic() of the last failed publish
        options = celery.conf.broker_transport_options or {}
        self._redis = celery_redis_client(  # one Redis, or the master its sentinels name
            celery,
            socket_timeout=options.get("socket_timeout", SOCKET_TIMEOUT_S),
            socket_connect_timeout=options.get("socket_connect_timeout", SOCKET_TIMEOUT_S),
            retry=Retry(NoBackoff(), int(PUBLISH_RETRY_POLICY["max_retries"])),
        )
        self._origin = f"gen{os.getpid()}@{socket.gethostname()}"  # as Celery names a sender
        self._wake = self._redis.register_script(_WAKE)
        # Wake-ups `once` left out: one for their version was waiting already, or a child
        # waiting for more of it heard of them (`heard`).
        self.skipped = 0
        self.heard = 0

    def publish(
        self,
        *,
        model: str,
        version: int,
        job_ids: Sequence[str],
        retry: bool = False,
        once: bool = False,
    ) -> bool:
        """Returns False (and logs) when the broker could not take the message, or failed one
        less than PUBLISH_BACKOFF_S ago (the jobs stay queued for the sweeper either way).
        `retry`: the jobs were taken back from a worker; their wake-up goes first.
        A child whose task waits for more fresh jobs of the version hears of these (unless
        `retry`) and claims them (worker/linger.py).
        `once`: the jobs are fresh (never claimed in this run), so any claim of their version
        may take them: no message is pushed while one for that version waits to be taken, or
        when such a child heard of them, unless it names more than ONCE_MAX_JOBS jobs (a
        message shares those out among idle children). Under a steady stream of small jobs the
        broker then carries about one message per task the workers run, not one per
        submission."""
        if time.monotonic() - self._failed_at < PUBLISH_BACKOFF_S:
            return False
        priority = PRIORITY_RETRY if retry else PRIORITY_WAKE
        queue = queue_for(model)
        try:
            message = self.wake_up(model=model, version=version, job_ids=job_ids, priority=priority)
            if retry:  # jobs that ran before: no claim of fresh jobs takes them
                self._redis.lpush(wake_up_list(queue, priority), message)
            else:
                pushed = self._wake(
                    keys=[wake_up_list(queue, priority), fresh_channel(model, version)],
                    args=[message, _marker(version), int(once and len(job_ids) <= ONCE_MAX_JOBS)],
                )
                self.skipped += pushed != PUSHED
                self.heard += pushed == HEARD
        except Exception as exc:  # redis raises many kinds; all mean "not published"
            log.warning(
                "publish of %d %s jobs failed (%s); they stay queued", len(job_ids), model, exc
            )
            self._failed_at = time.monotonic()
            return False
        self._failed_at = -float("inf")
        return True

    def wake_up(self, *, model: str, version: int, job_ids: Sequence[str], priority: int) -> bytes:
        """The message `publish` pushes: a `run_batch(model, version, job_ids)` task message as
        `send_task(..., queue=queue_for(model), priority=priority)` would store it in Redis."""
        task_id = str(uuid.uuid4())
        headers, properties, body, _ = self._celery.amqp.as_task_v2(
            task_id,
            RUN_BATCH_TASK,
            [model, version, list(job_ids)],
            reply_to=self._celery.thread_oid,
            origin=self._origin,
            ignore_result=None,
        )
        headers[VERSION_HEADER] = str(version)
        return orjson.dumps(
            {
                "body": base64.b64encode(orjson.dumps(body)).decode(),
                "content-encoding": "utf-8",
                "content-type": "application/json",
                "headers": headers,
                "properties": {
                    **properties,
                    "delivery_mode": 2,  # persistent, as Celery's default exchange has it
                    # The default exchange: kombu's restore of an unacknowledged message
                    # sends it back to the queue named by its routing key.
                    "delivery_info": {"exchange": "", "routing_key": queue_for(model)},
                    "priority": priority,
                    "body_encoding": "base64",
                    "delivery_tag": str(uuid.uuid4()),
                },
            }
        )

    def ping(self) -> None:
        # One quick retry, no back-off: kombu's default first sleep is 2 s, longer than a probe's
        # usual timeout, so a dead broker would time the probe out instead of answering 503.
        with self._celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.1, timeout=2)


def _marker(version: int) -> str:
    """How a wake-up of `version` shows in the message `Publisher.wake_up` stores."""
    return orjson.dumps({VERSION_HEADER: str(version)}).decode()[1:-1]
