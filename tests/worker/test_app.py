"""The worker's Celery app: built from the process settings, its task, and a main process that
never loads TensorFlow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tffleet.broker import RUN_BATCH_TASK
from tffleet.settings import Settings, get_settings
from worker.app import celery_app

ROOT = Path(__file__).resolve().parents[2]


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


def test_run_batch_retries_database_and_object_store_errors_with_backoff_and_nothing_else() -> None:
    from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

    import worker.tasks  # noqa: F401  (registers the task)
    from tffleet.objectstore import StoreUnavailable

    task = celery_app.tasks[RUN_BATCH_TASK]

    assert set(task.autoretry_for) == {OperationalError, InterfaceError, StoreUnavailable}
    assert not issubclass(IntegrityError, tuple(task.autoretry_for))  # a bug, not a blink
    assert task.retry_backoff is True and task.retry_backoff_max == 30
    assert task.max_retries is None


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


def test_a_child_that_cannot_start_exits_for_the_pool_to_start_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery keeps a child whose `worker_process_init` handler raised; ours must not stay (it
    would fail every batch it is sent): it exits, after a pause, with a non-zero status."""
    import worker.app
    from worker import child

    class Exited(Exception):
        pass

    def refuse(*_: object, **__: object) -> None:
        raise OSError("Network is unreachable")

    def exit_(status: int) -> None:
        raise Exited(status)

    slept: list[float] = []
    monkeypatch.setattr(child, "init", refuse)
    monkeypatch.setattr(worker.app.time, "sleep", slept.append)
    monkeypatch.setattr(worker.app.os, "_exit", exit_)

    with pytest.raises(Exited) as exited:
        worker.app._init_child()

    assert exited.value.args == (1,)
    assert slept == [worker.app.INIT_FAILED_EXIT_DELAY_S]
