"""A child's model versions kept in step with the repository: load, warm, register, retire,
drain, unload; and what a child does with a message for a version it does not hold.

A plain class stands in for TensorFlow (the real path is in tests/e2e/test_versions.py); the
database is real (SQLite: what is tested here is the child's, not SQL).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import redis
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, presence, registry
from db.models import Job, JobStatus, ModelPresence, ModelVersion
from tffleet.constants import MODELS_RELOAD_CHANNEL
from tffleet.devices import Device
from tffleet.errors import ModelNotFound
from worker.batching import Batcher
from worker.child import Child
from worker.model_set import ModelSet
from worker.repository import ModelConfig, ModelSpec
from worker.watcher import Watcher

Sessions = sessionmaker[Session]
POLL_S = 0.05
GRACE_S = 5.0  # DRAIN_GRACE_MIN_S: two polls of 0.05 s are shorter


class Runner:
    """A model that multiplies by its version; remembers what happened to it."""

    format = "saved_model"

    def __init__(self, spec: ModelSpec, events: list[str]) -> None:
        self.spec = spec
        self.events = events
        self.inputs = {"x": {"dtype": "float32", "shape": [-1, 2]}}
        self.outputs = {"y": {"dtype": "float32", "shape": [-1, 2]}}
        self.closed = False

    def warm_up(self, sizes: tuple[int, ...]) -> float:
        self.events.append(f"warm {self.spec.name}:{self.spec.version}")
        return 0.0

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": batch["x"] * self.spec.version}

    def close(self) -> None:
        self.closed = True
        self.events.append(f"close {self.spec.name}:{self.spec.version}")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def add_version(repository: Path, name: str, version: int, content: str = "ok") -> Path:
    """A version directory; `content` "corrupt" makes the loader raise."""
    path = repository / name / str(version)
    path.mkdir(parents=True, exist_ok=True)
    (path / "saved_model.pb").write_text(content)
    return path


class Fleet:
    """Model sets of children on one repository and database, with what they did."""

    def __init__(self, repository: Path, sessions: Sessions) -> None:
        self.repository = repository
        self.sessions = sessions
        self.clock = Clock()
        self.events: list[str] = []
        self.woken: list[tuple[str, int, list[str]]] = []

    def load(self, spec: ModelSpec) -> Runner:
        self.events.append(f"load {spec.name}:{spec.version}")
        if (spec.path / "saved_model.pb").read_text() == "corrupt":
            raise ValueError(f"{spec.path}: truncated variables")
        return Runner(spec, self.events)

    def wake(self, model: str, version: int, job_ids: Sequence[str]) -> None:
        self.woken.append((model, version, list(job_ids)))

    def child(self, device: str = "cpu:0", names: Sequence[str] | None = None) -> ModelSet:
        models = ModelSet(
            repository=self.repository,
            defaults=ModelConfig(max_batch_size=4),
            child=presence.Child(id=f"h/1/{device}/x", host="h", pid=1, device=device),
            sessions=self.sessions,
            load=self.load,
            wake=self.wake,
            poll_s=POLL_S,
            names=names,
            clock=self.clock,
        )
        self.events.append(f"child {device}")
        return models

    def rows(self) -> list[tuple[str, str, int, str]]:
        with self.sessions() as session:
            found = session.scalars(select(ModelPresence).order_by(ModelPresence.child))
            return [(r.device, r.name, r.version, r.state) for r in found]

    def registered(self) -> dict[tuple[str, int], bool]:
        """Registered versions -> retired."""
        with self.sessions() as session:
            return {
                (m.name, m.version): m.retired_at is not None
                for m in session.scalars(select(ModelVersion))
            }


@pytest.fixture
def fleet(tmp_path: Path, sessions: Sessions) -> Fleet:
    (tmp_path / "models").mkdir()
    return Fleet(tmp_path / "models", sessions)


def submit(sessions: Sessions, count: int = 1, *, version: int = 1) -> list[str]:
    new = [jobs.NewJob(model="m", version=version, samples=1, inputs=b"x")] * count
    with sessions.begin() as session:
        return [job.id for job in jobs.create(session=session, jobs=new)]


def finish(sessions: Sessions, job_ids: list[str]) -> None:
    with sessions.begin() as session:
        leases = jobs.claim(session=session, job_ids=job_ids, owner="w", lease_s=60)
        jobs.complete(session=session, results=[(lease, b"out") for lease in leases])


def status(sessions: Sessions, job_id: str) -> tuple[str, str | None]:
    with sessions() as session:
        job = session.get(Job, job_id, populate_existing=True)
        assert job is not None
        return job.status, job.error_code


# Loading


def test_a_child_loads_warms_and_registers_the_newest_version_only(fleet: Fleet) -> None:
    add_version(fleet.repository, "m", 1)
    add_version(fleet.repository, "m", 2)

    models = fleet.child()
    models.refresh()

    assert list(models.models) == [("m", 2)]
    assert fleet.events == ["child cpu:0", "load m:2", "warm m:2"]
    assert fleet.registered() == {("m", 2): False}
    assert fleet.rows() == [("cpu:0", "m", 2, "loaded")]


def test_versions_all_or_a_list_serve_those_versions(fleet: Fleet) -> None:
    for version in (1, 2, 3):
        add_version(fleet.repository, "m", version)
    toml = fleet.repository / "m" / "model.toml"

    toml.write_text('versions = "all"\n')
    every = fleet.child()
    every.refresh()
    toml.write_text("versions = [1, 3]\n")
    some = fleet.child("cpu:1")
    some.refresh()

    assert sorted(every.models) == [("m", 1), ("m", 2), ("m", 3)]
    assert sorted(some.models) == [("m", 1), ("m", 3)]


def test_a_model_whose_devices_exclude_the_child_is_not_loaded_there(fleet: Fleet) -> None:
    add_version(fleet.repository, "m", 1)
    (fleet.repository / "m" / "model.toml").write_text('devices = ["cpu:1"]\n')

    skipped, chosen = fleet.child("cpu:0"), fleet.child("cpu:1")
    skipped.refresh()
    chosen.refresh()

    assert (list(skipped.models), list(chosen.models)) == ([], [("m", 1)])
    assert fleet.rows() == [("cpu:1", "m", 1, "loaded")]


def test_a_child_serves_only_its_workers_models(fleet: Fleet) -> None:
    add_version(fleet.repository, "a", 1)
    add_version(fleet.repository, "b", 1)

    models = fleet.child(names=["a"])
    models.refresh()

    assert list(models.models) == [("a", 1)]


def test_a_model_added_after_the_start_is_loaded_registered_its_queue_consumed_and_logged(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    add_version(fleet.repository, "a", 1)
    consumed: list[str] = []
    models = ModelSet(
        repository=fleet.repository,
        defaults=ModelConfig(max_batch_size=4),
        child=presence.Child(id="h/1/cpu:0/x", host="h", pid=1, device="cpu:0"),
        sessions=fleet.sessions,
        load=fleet.load,
        wake=fleet.wake,
        poll_s=POLL_S,
        clock=fleet.clock,
        consume=consumed.append,
    )
    models.refresh()
    add_version(fleet.repository, "mnv2", 1)
    add_version(fleet.repository, "bad", 1, "corrupt")

    with caplog.at_level(logging.INFO, logger="worker.model_set"):
        models.refresh()
        models.refresh()

    assert sorted(models.models) == [("a", 1), ("mnv2", 1)]
    assert fleet.registered() == {("a", 1): False, ("mnv2", 1): False}
    # Only the new model's queue: the worker consumes those of the start already.
    assert consumed == ["mnv2"]
    assert [r.getMessage() for r in caplog.records].count("serving new model mnv2:1") == 1
    assert ("cpu:0", "bad", 1, "failed") in fleet.rows()
    assert "truncated variables" in (models.failure(("bad", 1)) or "")


# A new version


def test_a_new_version_takes_over_once_loaded_and_the_old_one_drains_until_its_jobs_are_done(
    fleet: Fleet, sessions: Sessions
) -> None:
    add_version(fleet.repository, "m", 1)
    models = fleet.child()
    models.refresh()
    old = models.models["m", 1].runner
    pending = submit(sessions, 2, version=1)

    add_version(fleet.repository, "m", 2)
    models.refresh()

    assert sorted(models.models) == [("m", 1), ("m", 2)]
    assert fleet.events[-2:] == ["load m:2", "warm m:2"]
    assert fleet.registered() == {("m", 1): True, ("m", 2): False}
    assert fleet.rows() == [("cpu:0", "m", 1, "draining"), ("cpu:0", "m", 2, "loaded")]
    with sessions() as session, pytest.raises(ModelNotFound, match="retired"):
        registry.resolve(session=session, name="m", version=1)

    fleet.clock.now += GRACE_S
    models.refresh()
    assert ("m", 1) in models.models  # its jobs are still queued
    finish(sessions, pending)
    models.refresh()

    assert list(models.models) == [("m", 2)]
    assert old.closed
    assert fleet.rows() == [("cpu:0", "m", 2, "loaded")]


def test_a_drained_version_stays_loaded_for_the_grace_period(
    fleet: Fleet, sessions: Sessions
) -> None:
    add_version(fleet.repository, "m", 1)
    models = fleet.child()
    models.refresh()
    add_version(fleet.repository, "m", 2)
    models.refresh()

    fleet.clock.now += GRACE_S - 0.1
    models.refresh()
    assert ("m", 1) in models.models  # no job left, but an API may still hold a cached view
    fleet.clock.now += 0.1
    models.refresh()
    assert ("m", 1) not in models.models


def test_a_version_is_not_unloaded_under_a_running_batch(fleet: Fleet) -> None:
    add_version(fleet.repository, "m", 1)
    models = fleet.child()
    models.refresh()
    add_version(fleet.repository, "m", 2)
    models.refresh()
    fleet.clock.now += GRACE_S

    with models.use(("m", 1)) as loaded:
        assert loaded is not None
        models.refresh()  # waits one poll for the batch, then gives up until the next
        assert not loaded.runner.closed
    models.refresh()
    assert loaded.runner.closed


def test_a_new_version_wakes_its_jobs_that_were_queued_before_any_child_held_it(
    fleet: Fleet, sessions: Sessions
) -> None:
    add_version(fleet.repository, "m", 1)
    models = fleet.child()
    models.refresh()
    early = submit(sessions, 5, version=2)  # say `tffleet models register` recorded it first

    add_version(fleet.repository, "m", 2)
    models.refresh()

    assert fleet.woken == [("m", 2, early[:4]), ("m", 2, early[4:])]  # max_batch_size 4


def test_removing_the_new_version_brings_the_old_one_back(fleet: Fleet) -> None:
    add_version(fleet.repository, "m", 1)
    add_version(fleet.repository, "m", 2)
    models = fleet.child()
    models.refresh()

    (fleet.repository / "m" / "2" / "saved_model.pb").unlink()
    (fleet.repository / "m" / "2").rmdir()
    models.refresh()

    assert fleet.registered() == {("m", 1): False, ("m", 2): True}
    assert fleet.rows() == [("cpu:0", "m", 1, "loaded"), ("cpu:0", "m", 2, "draining")]


# Versions that do not load


def test_a_version_that_fails_to_load_is_reported_logged_once_and_retried_when_its_files_change(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    add_version(fleet.repository, "m", 1)
    models = fleet.child()
    models.refresh()
    path = add_version(fleet.repository, "m", 2, content="corrupt")  # a copy still running

    with caplog.at_level(logging.ERROR, logger="worker.model_set"):
        for _ in range(3):
            models.refresh()

    assert fleet.events.count("load m:2") == 1
    assert len([r for r in caplog.records if "truncated variables" in r.message]) == 1
    assert models.failure(("m", 2)) == f"ValueError: {path}: truncated variables"
    assert fleet.rows() == [("cpu:0", "m", 1, "loaded"), ("cpu:0", "m", 2, "failed")]
    assert fleet.registered() == {("m", 1): False}  # the old one still serves

    (path / "saved_model.pb").write_text("ok")  # the copy finished
    models.refresh()

    assert fleet.events.count("load m:2") == 2
    assert models.failure(("m", 2)) is None
    assert fleet.rows() == [("cpu:0", "m", 1, "draining"), ("cpu:0", "m", 2, "loaded")]


def test_a_reload_tries_a_failed_version_again_even_unchanged(fleet: Fleet) -> None:
    add_version(fleet.repository, "m", 1, content="corrupt")
    models = fleet.child()
    models.refresh()
    models.refresh(retry=True)
    assert fleet.events.count("load m:1") == 2


def test_an_unreadable_model_toml_is_reported_and_changes_nothing_loaded(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    add_version(fleet.repository, "m", 1)
    models = fleet.child()
    models.refresh()
    (fleet.repository / "m" / "model.toml").write_text("max_batch_size = 'lots'\n")

    with caplog.at_level(logging.ERROR, logger="worker.model_set"):
        models.refresh()
        models.refresh()

    assert list(models.models) == [("m", 1)]
    assert fleet.rows() == [("cpu:0", "m", 0, "failed"), ("cpu:0", "m", 1, "loaded")]
    assert len([r for r in caplog.records if "max_batch_size" in r.message]) == 1
    (fleet.repository / "m" / "model.toml").unlink()
    models.refresh()
    assert fleet.rows() == [("cpu:0", "m", 1, "loaded")]


# A message for a version this child does not hold


@pytest.fixture
def make_child(engine: Engine, sessions: Sessions, fleet: Fleet) -> Callable[..., Child]:
    def make(models: ModelSet) -> Child:
        batcher = Batcher(
            sessions=sessions,
            owner=models.child.id,
            lease_s=60,
            notify=lambda ids: None,
            wake=fleet.wake,
        )
        return Child(device=Device("cpu", 0), engine=engine, batcher=batcher, model_set=models)

    return make


def test_a_message_for_a_version_another_child_holds_goes_back_to_the_queue(
    fleet: Fleet, sessions: Sessions, make_child: Callable[..., Child]
) -> None:
    add_version(fleet.repository, "m", 1)
    (fleet.repository / "m" / "model.toml").write_text('devices = ["cpu:1"]\n')
    fleet.child("cpu:1").refresh()
    lacking = make_child(fleet.child("cpu:0"))
    queued, taken = submit(sessions, 2)
    finish(sessions, [taken])

    report = lacking.turn_away("m", 1, [queued, taken])

    assert report.claimed == 0
    assert fleet.woken == [("m", 1, [queued])]
    assert status(sessions, queued) == (JobStatus.QUEUED, None)


def test_a_message_for_a_version_no_live_child_holds_leaves_its_jobs_queued(
    fleet: Fleet, sessions: Sessions, make_child: Callable[..., Child]
) -> None:
    add_version(fleet.repository, "m", 2)
    child = make_child(fleet.child())
    child.model_set.refresh()
    (job,) = submit(sessions, version=1)  # a version nobody serves now

    child.turn_away("m", 1, [job])

    assert fleet.woken == []
    assert status(sessions, job) == (JobStatus.QUEUED, None)


def test_a_message_for_a_version_that_failed_to_load_everywhere_fails_its_jobs(
    fleet: Fleet, sessions: Sessions, make_child: Callable[..., Child]
) -> None:
    add_version(fleet.repository, "m", 1, content="corrupt")
    child = make_child(fleet.child())
    child.model_set.refresh()
    (job,) = submit(sessions)

    report = child.turn_away("m", 1, [job])

    assert report.failed == 1
    assert status(sessions, job) == (JobStatus.FAILED, "model_error")
    with sessions() as session:
        message = jobs.get(session=session, job_id=job).error_message
    assert message is not None and "could not be loaded" in message
    assert "truncated variables" in message


def wait_until(check: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_watcher_rescans_every_poll_and_at_once_on_a_reload_message(
    fleet: Fleet, redis_url: str
) -> None:
    add_version(fleet.repository, "m", 1)
    models = fleet.child()
    models.refresh()
    watcher = Watcher(models, broker_url=redis_url)
    watcher.start()
    try:
        add_version(fleet.repository, "m", 2, content="corrupt")
        wait_until(lambda: models.failure(("m", 2)) is not None)  # found by a poll
        with redis.Redis.from_url(redis_url) as client:
            wait_until(lambda: client.publish(MODELS_RELOAD_CHANNEL, b"{}") == 1)
        wait_until(lambda: fleet.events.count("load m:2") >= 2)  # unchanged, yet tried again
    finally:
        watcher.stop()
    assert fleet.rows()[-1] == ("cpu:0", "m", 2, "failed")


def test_the_watcher_stops_at_once_however_long_its_poll(
    fleet: Fleet, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = fleet.child()
    monkeypatch.setattr(models, "poll_s", 60.0)  # a stop must not wait out a poll
    watcher = Watcher(models, broker_url=redis_url)
    watcher.start()
    time.sleep(0.3)  # the rescan thread is listening on the reload channel by now

    watcher.stop(timeout_s=10)

    assert not any(thread.is_alive() for thread in watcher._threads)
