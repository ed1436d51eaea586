"""The baseline: plain Celery with one task per one-sample job, the model held per child.

This is the pattern tffleet replaces: the model is loaded once per prefork child, every job is its
own task, and the client waits on the result through the Redis result backend.

    celery -A bench.plain_celery worker --pool=prefork --concurrency=1
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

app = Celery(
    "plain",
    broker=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0"),
)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    worker_hijack_root_logger=False,
)

_model: Any = None


@worker_process_init.connect
def _load(**_: object) -> None:
    global _model
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("BENCH_THREADS", "1")))
    tf.config.threading.set_inter_op_parallelism_threads(1)
    _model = tf.saved_model.load(os.environ["BENCH_MODEL_PATH"]).signatures["serving_default"]


@app.task(name="plain.predict")
def predict(x: list[list[float]]) -> list[list[float]]:
    import tensorflow as tf

    (out,) = _model(x=tf.constant(x, dtype=tf.float32)).values()
    return out.numpy().tolist()
