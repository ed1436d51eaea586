"""A worker child's life: pin to its device, load its models, run batches, clean up.

`init()` runs in `worker_process_init`, in the forked child, before any task. The Celery main
process never calls it, so it never imports TensorFlow or touches CUDA. The child loads its
models there, then keeps them in step with the repository from two background threads
(worker/model_set.py, worker/watcher.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import billiard.process
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from db import clock, jobs, presence
from db import secrets as fleet_secrets
from db.engine import make_engine, make_sessionmaker, readonly
from db.models import PresenceState
from tffleet.broker import Publisher, queue_for
from tffleet.devices import Device, cpu_threads_per_child, parse_devices, pin_environment
from tffleet.objectstore import open_store
from tffleet.settings import get_settings
from worker import transform_warm
from worker.announcer import Announcer
from worker.batching import Batcher, BatchReport
from worker.busy import BusyMeter
from worker.linger import Listener
from worker.model_set import ModelSet
from worker.objects import Objects
from worker.orphans import owner_prefix
from worker.repository import ModelConfig
from worker.retry import HAND_BACK_PAUSE_S
from worker.watcher import Watcher

log = logging.getLogger(__name__)


@dataclass
class Child:
    device: Device
    engine: Engine
    batcher: Batcher
    model_set: ModelSet
    watcher: Watcher | None = None

    def turn_away(self, model: str, version: int, job_ids: Sequence[str]) -> BatchReport:
        """A message for a version this child does not hold.

        - Another live child holds it (this one is still loading it, drained it, or its device is
          not among the model's `devices`): publish the still-queued jobs again for that one,
          or, where none is, a wake-up for the version's other fresh jobs that wait (a
          submission publishes none while a message for its version waits: this was it).
        - No live child holds it, and this one failed to load it: fail the jobs `model_error`
          with the reason, as no worker can run them.
        - Otherwise (nobody serves it now): leave them queued; the child that loads it, or the
          sweeper once some child holds it, wakes them.
        """
        models = self.model_set
        with models.sessions() as session:
            others = presence.holders(
                session=session,
                name=model,
                version=version,
                since=presence.live_since(models.poll_s, clock.now(session)),
                exclude=models.child.id,
            )
            queued = (
                jobs.queued_ids(session=session, model=model, version=version, among=job_ids)
                if others
                else []
            )
            waiting = (
                jobs.some_queued(session=session, model=model, version=version, limit=1)
                if others and not queued
                else []
            )
        if others:
            if queued or waiting:
                time.sleep(HAND_BACK_PAUSE_S)
            if queued:
                self.batcher.wake(model, version, queued)
            elif waiting:
                self.batcher.wake_once(model, version, waiting)
            return BatchReport()
        error = models.failure((model, version))
        if error is not None:
            message = f"model {model!r} version {version} could not be loaded: {error}"
            return self.batcher.fail_named(
                model=model, version=version, job_ids=job_ids, message=message
            )
        log.info(
            "no live worker holds %s:%s; its %d jobs stay queued until one does",
            model, version, len(job_ids),
        )  # fmt: skip
        return BatchReport()


class Peers:
    """How many other live children hold a model version, read at most once per `poll_s`."""

    def __init__(self, sessions: sessionmaker[Session], *, child: str, poll_s: float) -> None:
        self._sessions = sessions
        self._child = child
        self._poll_s = poll_s
        self._seen: dict[tuple[str, int], tuple[float, int]] = {}

    def __call__(self, model: str, version: int) -> int:
        now = time.monotonic()
        seen = self._seen.get((model, version))
        if seen is not None and now - seen[0] < self._poll_s:
            return seen[1]
        with self._sessions() as session:
            count = len(
                presence.holders(
                    session=session,
                    name=model,
                    version=version,
                    since=presence.live_since(self._poll_s, clock.now(session)),
                    states=(PresenceState.LOADED.value,),
                    exclude=self._child,
                )
            )
        self._seen[(model, version)] = (now, count)
        return count


_child: Child | None = None


def current() -> Child:
    if _child is None:
        raise RuntimeError("this process is not an initialized tffleet worker child")
    return _child


def child_index() -> int:
    return int(getattr(billiard.process.current_process(), "index", 0) or 0)


def init(app: Celery, *, nodename: str | None = None) -> None:
    """Make this process a worker child of `app` (worker/app.py, which calls it); `nodename`:
    its worker's, which consumes the queues of models that appear later."""
    global _child
    settings = get_settings()
    devices = parse_devices(settings.devices)
    index = child_index()
    device = devices[index % len(devices)]
    threads = cpu_threads_per_child(len(devices)) if device.kind == "cpu" else 2
    # Before TensorFlow is imported: this child must see its own device and nothing else.
    os.environ.update(pin_environment(device, cpu_threads=threads))

    from worker import runtime  # the first TensorFlow import in this process

    runtime.configure_threads(intra_op=threads)
    # Its main process finds a dead child's jobs by this prefix (worker/orphans.py).
    owner = f"{owner_prefix(socket.gethostname(), os.getpid())}{device}/{uuid.uuid4().hex[:6]}"
    # The task thread, the batch feeder and writer, the lease heartbeat, reports and rescans:
    # one connection each.
    engine = make_engine(settings.database_url, pool_size=6)
    sessions, reads = make_sessionmaker(engine), make_sessionmaker(readonly(engine))
    with sessions() as session:
        key = fleet_secrets.get(session=session, name=fleet_secrets.ANNOUNCEMENTS)
    # Signed: the API may answer a long-poll from a job this child announces whole.
    announce = Announcer.connect(settings.broker_url, key=key)
    publisher = Publisher(app)

    def wake(model: str, version: int, job_ids: Sequence[str]) -> None:
        # A failed publish is logged by the publisher; the sweeper republishes the jobs later.
        publisher.publish(model=model, version=version, job_ids=job_ids)

    def wake_once(model: str, version: int, job_ids: Sequence[str]) -> None:
        publisher.publish(model=model, version=version, job_ids=job_ids, once=True)

    busy = BusyMeter()
    batcher = Batcher(
        sessions=sessions,
        reads=reads,
        owner=owner,
        lease_s=settings.lease_s,
        notify=announce,
        wake=wake,
        wake_once=wake_once,
        device=str(device),
        peers=Peers(reads, child=owner, poll_s=settings.model_poll_s),
        on_busy=lambda model, version, seconds: busy.add((model, version), seconds),
        listener=Listener.connect(settings.broker_url),
        # Opened once: inputs held in the store are read from it, large outputs written to it.
        objects=Objects(
            open_store(settings.object_store), inline_max_bytes=settings.inline_max_bytes
        ),
    )
    defaults = ModelConfig(
        max_batch_size=settings.max_batch_size,
        max_queue_delay_ms=settings.max_queue_delay_ms,
        timeout_s=settings.job_timeout_s,
    )

    def consume(model: str) -> None:
        # Celery's remote control: the worker's main process adds the queue to its consumer
        # (a no-op if it consumes it already). Its messages wait in Redis until then.
        if nodename is not None:
            app.control.add_consumer(queue_for(model), destination=[nodename], reply=False)

    served = None
    if settings.worker_models is not None:
        served = [m.strip() for m in settings.worker_models.split(",") if m.strip()]
    model_set = ModelSet(
        repository=settings.model_repository,
        defaults=defaults,
        child=presence.Child(
            id=owner, host=socket.gethostname(), pid=os.getpid(), device=str(device)
        ),
        sessions=sessions,
        load=runtime.load,
        wake=wake,
        poll_s=settings.model_poll_s,
        names=served,
        busy=busy,
        consume=consume,
    )
    # Before any task: the messages waiting for these models find them loaded.
    model_set.refresh(wake=False)
    # And a transform's first shard finds its reader and writer loaded (tens of ms, once).
    log.debug("transform reader and writer warmed in %.3fs", transform_warm.warm_up())
    watcher = Watcher(model_set, broker_url=settings.broker_url)
    watcher.start()
    _child = Child(
        device=device, engine=engine, batcher=batcher, model_set=model_set, watcher=watcher
    )


def shutdown() -> None:
    """Stop watching, and say this child holds nothing any more (the process exits next)."""
    global _child
    if _child is None:
        return
    if _child.watcher is not None:
        _child.watcher.stop()
    try:
        _child.model_set.held.withdraw()
    except Exception as exc:  # the rows go stale and the sweeper deletes them
        log.warning("could not withdraw this child's models (%s)", exc)
    _child.engine.dispose()
    _child = None
