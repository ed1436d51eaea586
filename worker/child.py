"""A worker child's life: pin to its device, load its models once, run batches, clean up.

`init()` runs in `worker_process_init`, in the forked child, before any task. The Celery main
process never calls it, so it never imports TensorFlow or touches CUDA.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import billiard.process
import orjson
import redis
from sqlalchemy import Engine

from db import registry
from db.engine import make_engine, make_sessionmaker
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.devices import Device, cpu_threads_per_child, parse_devices, pin_environment
from tffleet.settings import get_settings
from worker.batching import Batcher, BatchPolicy
from worker.repository import ModelConfig, ModelSpec, scan

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    spec: ModelSpec
    runner: Any
    policy: BatchPolicy


@dataclass
class Child:
    device: Device
    engine: Engine
    batcher: Batcher
    models: dict[tuple[str, int], LoadedModel] = field(default_factory=dict)
    failed: dict[tuple[str, int], str] = field(default_factory=dict)


_child: Child | None = None


def current() -> Child:
    if _child is None:
        raise RuntimeError("this process is not an initialized tffleet worker child")
    return _child


def child_index() -> int:
    return int(getattr(billiard.process.current_process(), "index", 0) or 0)


def init() -> None:
    global _child
    settings = get_settings()
    devices = parse_devices(settings.devices)
    index = child_index()
    device = devices[index % len(devices)]
    threads = cpu_threads_per_child(len(devices)) if device.kind == "cpu" else 2
    # Before TensorFlow is imported: this child must see its own device and nothing else.
    os.environ.update(pin_environment(device, cpu_threads=threads))

    from api.publish import Publisher
    from worker import runtime  # the first TensorFlow import in this process
    from worker.app import celery_app

    runtime.configure_threads(intra_op=threads)
    owner = f"{socket.gethostname()}/{os.getpid()}/{device}/{uuid.uuid4().hex[:6]}"
    engine = make_engine(settings.database_url, pool_size=2)
    sessions = make_sessionmaker(engine)
    notifier = redis.Redis.from_url(settings.broker_url, socket_timeout=5)

    def notify(job_ids: Sequence[str]) -> None:
        try:
            notifier.publish(JOBS_DONE_CHANNEL, orjson.dumps(list(job_ids)))
        except redis.RedisError:
            log.warning(
                "could not publish completion of %d jobs; pollers will see it late", len(job_ids)
            )

    publisher = Publisher(celery_app)

    def wake(model: str, version: int, job_ids: Sequence[str]) -> None:
        # A failed publish is logged by the publisher; the sweeper republishes the jobs later.
        publisher.publish(model=model, version=version, job_ids=job_ids)

    batcher = Batcher(
        sessions=sessions, owner=owner, lease_s=settings.lease_s, notify=notify, wake=wake
    )
    child = Child(device=device, engine=engine, batcher=batcher)
    defaults = ModelConfig(
        max_batch_size=settings.max_batch_size,
        max_queue_delay_ms=settings.max_queue_delay_ms,
        timeout_s=settings.job_timeout_s,
    )
    for spec in scan(settings.model_repository, defaults=defaults):
        key = (spec.name, spec.version)
        started = time.perf_counter()
        try:
            runner = runtime.load(spec)
            loaded_s = time.perf_counter() - started
            warm_s = runner.warm_up(spec.config.bucket_sizes())
        except Exception as exc:
            log.exception("child %s could not load %s:%s from %s", device, *key, spec.path)
            child.failed[key] = f"{type(exc).__name__}: {exc}"[:1000]
            continue
        policy = BatchPolicy(
            max_batch_size=spec.config.max_batch_size,
            max_queue_delay_ms=spec.config.max_queue_delay_ms,
            buckets=spec.config.bucket_sizes(),
            timeout_s=spec.config.timeout_s,
        )
        child.models[key] = LoadedModel(spec=spec, runner=runner, policy=policy)
        with sessions.begin() as session:
            registry.register(
                session=session,
                name=spec.name,
                version=spec.version,
                format=runner.format,
                inputs=runner.inputs,
                outputs=runner.outputs,
                config=spec.config.as_dict(),
            )
        log.info(
            "child %s (pid %d, CUDA_VISIBLE_DEVICES=%s) loaded %s:%s in %.2fs, "
            "warmed %d buckets in %.2fs",
            device, os.getpid(), os.environ["CUDA_VISIBLE_DEVICES"], spec.name, spec.version,
            loaded_s, len(policy.buckets), warm_s,
        )  # fmt: skip
    _child = child


def shutdown() -> None:
    global _child
    if _child is not None:
        _child.engine.dispose()
        _child = None
