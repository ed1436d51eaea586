"""Which children hold which versions, and what that means for submissions (both backends)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, presence, registry
from db.clock import utcnow
from db.models import JobStatus, PresenceState
from tffleet.errors import ModelNotFound

Sessions = sessionmaker[Session]

INPUTS = {"x": {"dtype": "float32", "shape": [-1, 4]}}
OUTPUTS = {"y": {"dtype": "float32", "shape": [-1, 2]}}
POLL_S = 5.0


def register(sessions: Sessions, *versions: int, name: str = "m") -> None:
    with sessions.begin() as session:
        for version in versions:
            registry.register(
                session=session,
                name=name,
                version=version,
                format="saved_model",
                inputs=INPUTS,
                outputs=OUTPUTS,
            )


def child(device: str = "cpu:0") -> presence.Child:
    return presence.Child(id=f"host/1/{device}/abc", host="host", pid=1, device=device)


def report(
    sessions: Sessions,
    *held: tuple[str, int, PresenceState],
    device: str = "cpu:0",
    at: datetime | None = None,
    error: str | None = None,
) -> None:
    now = at or utcnow()
    with sessions.begin() as session:
        presence.report(
            session=session,
            child=child(device),
            holdings=[
                presence.Holding(name, version, state, f"/models/{name}/{version}", now, error)
                for name, version, state in held
            ],
            now=now,
        )


def live_since() -> datetime:
    return presence.live_since(POLL_S, utcnow())


def resolve(sessions: Sessions, version: int | None = None, name: str = "m") -> int:
    with sessions() as session:
        return registry.resolve(
            session=session, name=name, version=version, live_since=live_since()
        ).version


LOADED, DRAINING, LOADING, FAILED = (
    PresenceState.LOADED,
    PresenceState.DRAINING,
    PresenceState.LOADING,
    PresenceState.FAILED,
)


def test_a_report_replaces_the_childs_rows_and_withdraw_removes_them(sessions: Sessions) -> None:
    report(sessions, ("m", 1, LOADED), ("m", 2, LOADING))
    report(sessions, ("m", 2, LOADED), device="cpu:1")
    report(sessions, ("m", 2, LOADED), ("m", 1, DRAINING))

    with sessions() as session:
        rows = presence.live(session=session, since=live_since())
        assert [(r.version, r.device, r.state) for r in rows] == [
            (1, "cpu:0", "draining"),
            (2, "cpu:0", "loaded"),
            (2, "cpu:1", "loaded"),
        ]
    with sessions.begin() as session:
        assert presence.withdraw(session=session, child_id=child().id) == 2
    with sessions() as session:
        assert [r.device for r in presence.live(session=session, since=live_since())] == ["cpu:1"]


def test_holders_are_live_children_that_run_the_versions_jobs(sessions: Sessions) -> None:
    report(sessions, ("m", 1, DRAINING), ("m", 2, LOADING), device="cpu:0")
    report(sessions, ("m", 1, LOADED), device="cpu:1")
    report(sessions, ("m", 1, LOADED), device="cpu:2", at=utcnow() - timedelta(minutes=5))

    with sessions() as session:
        found = presence.holders(session=session, name="m", version=1, since=live_since())
        assert sorted(found) == [child("cpu:0").id, child("cpu:1").id]
        assert presence.holders(
            session=session, name="m", version=1, since=live_since(), exclude=child("cpu:1").id
        ) == [child("cpu:0").id]
        assert presence.holders(session=session, name="m", version=2, since=live_since()) == []


def test_the_dead_are_purged_and_the_live_kept(sessions: Sessions) -> None:
    report(sessions, ("m", 1, LOADED), device="cpu:0")
    report(sessions, ("m", 1, LOADED), device="cpu:1", at=utcnow() - timedelta(minutes=5))

    with sessions.begin() as session:
        assert presence.purge_dead(session=session, before=live_since()) == 1
    with sessions() as session:
        assert [r.device for r in presence.live(session=session, since=datetime.min)] == ["cpu:0"]


# What a submission without a version gets


def test_without_a_live_worker_the_latest_registered_version(sessions: Sessions) -> None:
    register(sessions, 1, 3, 2)
    assert resolve(sessions) == 3


def test_the_latest_version_a_live_worker_has_loaded_comes_before_newer_registered_ones(
    sessions: Sessions,
) -> None:
    register(sessions, 1, 2, 3)  # 3: registered with `tffleet models register`, loaded nowhere
    report(sessions, ("m", 1, LOADED), ("m", 2, LOADING), ("m", 3, FAILED))
    assert resolve(sessions) == 1

    report(sessions, ("m", 1, DRAINING), ("m", 2, LOADED))  # 2 loaded and warmed: it takes over
    assert resolve(sessions) == 2


def test_a_worker_that_died_does_not_count(sessions: Sessions) -> None:
    register(sessions, 1, 2)
    report(sessions, ("m", 1, LOADED), at=utcnow() - timedelta(seconds=4 * POLL_S))
    assert resolve(sessions) == 2


def test_a_retired_version_is_never_the_latest_and_is_refused_by_name(sessions: Sessions) -> None:
    register(sessions, 1, 2)
    report(sessions, ("m", 1, DRAINING), ("m", 2, LOADED))
    with sessions.begin() as session:
        assert registry.retire(session=session, name="m", version=1) is True
        assert registry.retire(session=session, name="m", version=1) is False  # already

    assert resolve(sessions) == 2
    assert resolve(sessions, 2) == 2
    with pytest.raises(ModelNotFound, match=r"^version: .*'m' version 1 is retired.*\[2\]"):
        resolve(sessions, 1)


def test_a_worker_that_loads_a_retired_version_again_takes_it_out_of_retirement(
    sessions: Sessions,
) -> None:
    register(sessions, 1)
    with sessions.begin() as session:
        registry.retire(session=session, name="m", version=1)
    register(sessions, 1)
    assert resolve(sessions, 1) == 1

    with sessions.begin() as session:
        registry.retire(session=session, name="m", version=1)
        registry.reinstate(session=session, name="m", version=1)
    assert resolve(sessions, 1) == 1


# The fleet's view


def test_the_overview_shows_holders_queued_jobs_latest_and_load_errors(sessions: Sessions) -> None:
    register(sessions, 1, 2)
    register(sessions, 1, name="lonely")
    report(sessions, ("m", 1, DRAINING), ("m", 2, LOADED), ("m", 3, FAILED), error="corrupt")
    report(sessions, ("m", 2, LOADED), device="cpu:1")
    with sessions.begin() as session:
        registry.retire(session=session, name="m", version=1)
        created = jobs.create(
            session=session,
            jobs=[jobs.NewJob(model="m", version=1, samples=1, inputs=b"x")] * 2
            + [jobs.NewJob(model="lonely", version=1, samples=1, inputs=b"x")],
        )
        jobs.claim(session=session, job_ids=[created[0].id], owner="w", lease_s=60)

    with sessions() as session:
        found = registry.overview(session=session, live_since=live_since())

    views = {(v.model.name, v.model.version): v for v in found.versions}
    assert list(views) == [("lonely", 1), ("m", 1), ("m", 2)]
    old, new, lonely = views["m", 1], views["m", 2], views["lonely", 1]
    assert (old.retired, old.served, old.latest, old.queued, old.running) == (
        True,
        False,
        False,
        1,
        1,
    )
    assert [(h.device, h.state) for h in old.holders] == [("cpu:0", "draining")]
    assert (new.retired, new.served, new.latest) == (False, True, True)
    assert [h.device for h in new.holders] == ["cpu:0", "cpu:1"]
    assert (lonely.served, lonely.latest, lonely.holders, lonely.queued) == (False, True, [], 1)
    assert [(e.name, e.version, e.error) for e in found.load_errors] == [("m", 3, "corrupt")]


def test_unfinished_counts_and_drain_checks(sessions: Sessions) -> None:
    with sessions.begin() as session:
        ids = [
            job.id
            for job in jobs.create(
                session=session,
                jobs=[jobs.NewJob(model="m", version=v, samples=1, inputs=b"x") for v in (1, 1, 2)],
            )
        ]
        (lease,) = jobs.claim(session=session, job_ids=[ids[0]], owner="w", lease_s=60)
    with sessions() as session:
        assert jobs.count_unfinished(session=session) == {
            ("m", 1): {JobStatus.QUEUED.value: 1, JobStatus.RUNNING.value: 1},
            ("m", 2): {JobStatus.QUEUED.value: 1},
        }
        assert jobs.queued_ids(session=session, model="m", version=1) == [ids[1]]
        assert jobs.queued_ids(session=session, model="m", version=1, among=ids[:1]) == []
        assert jobs.has_unfinished(session=session, model="m", version=1)
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, b"out")])
        jobs.cancel(session=session, job_id=ids[1])
    with sessions() as session:
        assert not jobs.has_unfinished(session=session, model="m", version=1)
        assert jobs.has_unfinished(session=session, model="m", version=2)
