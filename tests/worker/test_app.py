"""The Celery app: settings that keep jobs safe, and a main process that never loads TensorFlow."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from celery import Celery

from tffleet.settings import Settings, get_settings
from worker.app import RUN_BATCH_TASK, celery_app, make_celery, queue_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings() -> Settings:
    return Settings(model_load_timeout_s=900, visibility_timeout_s=7200, lease_s=60)


def test_messages_are_json_only_never_pickle(settings: Settings) -> None:
    conf = make_celery(settings).conf

    assert conf.accept_content == ["json"]
    assert conf.task_serializer == "json"
    assert conf.result_serializer == "json"


def test_a_message_is_acknowledged_after_its_batch_and_redelivered_if_the_child_dies(
    settings: Settings,
) -> None:
    conf = make_celery(settings).conf

    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1


def test_celery_waits_for_a_child_to_load_its_models(settings: Settings) -> None:
    conf = make_celery(settings).conf

    assert conf.worker_proc_alive_timeout >= settings.model_load_timeout_s


def test_redis_redelivers_only_after_the_visibility_timeout_from_settings(
    settings: Settings,
) -> None:
    conf = make_celery(settings).conf

    assert conf.broker_transport_options["visibility_timeout"] == 7200
    assert conf.broker_transport_options["visibility_timeout"] > settings.lease_s


def test_a_child_stuck_past_the_visibility_timeout_is_killed_by_the_pool(
    settings: Settings,
) -> None:
    conf = make_celery(settings).conf

    assert conf.task_time_limit == settings.visibility_timeout_s


def test_a_jobs_time_limit_must_be_below_the_visibility_timeout() -> None:
    with pytest.raises(ValueError, match="TFFLEET_JOB_TIMEOUT_S"):
        Settings(job_timeout_s=600, visibility_timeout_s=600)
    assert Settings(job_timeout_s=599, visibility_timeout_s=600).job_timeout_s == 599


def test_the_shared_app_is_built_from_the_process_settings() -> None:
    settings = get_settings()

    assert celery_app.conf.accept_content == ["json"]
    assert celery_app.conf.worker_proc_alive_timeout >= settings.model_load_timeout_s
    assert celery_app.conf.broker_transport_options["visibility_timeout"] == (
        settings.visibility_timeout_s
    )


def test_run_batch_is_registered_under_its_stable_name() -> None:
    import worker.tasks  # noqa: F401  (registers the task)

    task = celery_app.tasks[RUN_BATCH_TASK]

    assert task.name == "tffleet.run_batch"
    assert task.acks_late is True
    assert task.reject_on_worker_lost is True


def test_run_batch_retries_database_errors_with_backoff_and_nothing_else() -> None:
    from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

    import worker.tasks  # noqa: F401  (registers the task)

    task = celery_app.tasks[RUN_BATCH_TASK]

    assert set(task.autoretry_for) == {OperationalError, InterfaceError}
    assert not issubclass(IntegrityError, tuple(task.autoretry_for))  # a bug, not a blink
    assert task.retry_backoff is True and task.retry_backoff_max == 30
    assert task.max_retries is None


def test_each_model_has_its_own_queue() -> None:
    assert queue_for("resnet") == "tffleet.resnet"
    assert queue_for("resnet") != queue_for("bert")


@pytest.fixture
def redis_app(redis_url: str) -> Iterator[Celery]:
    app = make_celery(Settings(broker_url=redis_url))
    yield app
    app.close()


def test_a_published_batch_message_is_json_on_the_wire(redis_app: Celery, redis_url: str) -> None:
    redis_app.send_task(RUN_BATCH_TASK, args=["m", 2, ["job-1"]], queue=queue_for("m"))

    client = redis.Redis.from_url(redis_url)
    try:
        (raw,) = client.lrange(queue_for("m"), 0, -1)
    finally:
        client.close()
    message = orjson.loads(raw)
    assert message["content-type"] == "application/json"
    assert message["headers"]["task"] == RUN_BATCH_TASK
    args, kwargs, _ = orjson.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == (["m", 2, ["job-1"]], {})


@pytest.mark.slow
def test_the_api_and_the_worker_main_process_never_import_tensorflow() -> None:
    code = (
        "import worker.app, worker.tasks, api.app, sys; "
        "loaded = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules); "
        "assert not loaded, loaded"
    )

    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
