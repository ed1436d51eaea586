"""`registry.unregister`: what it refuses, what it cancels and what it deletes (both backends)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, presence, registry, tenants, webhooks
from db.clock import utcnow
from db.models import (
    DEFAULT_TENANT,
    JobStatus,
    ModelPresence,
    ModelVersion,
    PresenceState,
    WebhookDelivery,
)
from tests.db.conftest import MakeJobs, read
from tffleet.errors import Conflict, ModelNotFound

Sessions = sessionmaker[Session]

SIGNATURE = {"x": {"dtype": "float32", "shape": [-1, 4]}}
POLL_S = 5.0


def register(sessions: Sessions, name: str, *versions: int) -> None:
    with sessions.begin() as session:
        for version in versions:
            registry.register(
                session=session,
                name=name,
                version=version,
                format="saved_model",
                inputs=SIGNATURE,
                outputs=SIGNATURE,
            )


def report(
    sessions: Sessions, child: str, *held: tuple[str, int, PresenceState], at: datetime
) -> None:
    error = "OSError: cannot load"  # of the failed ones
    with sessions.begin() as session:
        presence.report(
            session=session,
            child=presence.Child(id=child, host=child.split("/")[0], pid=1, device="cpu:0"),
            holdings=[
                presence.Holding(
                    name,
                    version,
                    state,
                    f"/m/{name}/{version}",
                    at,
                    error if state == PresenceState.FAILED else None,
                )
                for name, version, state in held
            ],
            now=at,
        )


def unregister(sessions: Sessions, name: str, **kwargs: object) -> registry.Unregistered:
    with sessions.begin() as session:
        return registry.unregister(
            session=session,
            name=name,
            live_since=presence.live_since(POLL_S, utcnow()),
            **kwargs,  # type: ignore[arg-type]
        )


def registered(sessions: Sessions) -> list[tuple[str, int]]:
    with sessions() as session:
        return [(m.name, m.version) for m in registry.list_versions(session=session)]


def presence_rows(sessions: Sessions) -> list[tuple[str, str, int]]:
    with sessions() as session:
        rows = session.scalars(select(ModelPresence).order_by(ModelPresence.child))
        return [(r.child, r.name, r.version) for r in rows]


def test_unregister_deletes_every_version_and_the_dead_childrens_rows(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    register(sessions, "old", 1, 2)
    register(sessions, "kept", 1)
    ended = make_jobs(model="old", version=1)[0]
    with sessions.begin() as session:
        jobs.cancel(session=session, job_id=ended)
    long_ago = utcnow() - timedelta(hours=1)
    report(sessions, "dead/1/cpu:0/a", ("old", 1, PresenceState.LOADED), at=long_ago)
    report(sessions, "live/1/cpu:0/b", ("old", 3, PresenceState.FAILED),
           ("kept", 1, PresenceState.LOADED), at=utcnow())  # fmt: skip

    done = unregister(sessions, "old")

    assert (done.name, done.versions, done.canceled) == ("old", [1, 2], {})
    assert done.presence == 2  # the dead child's row and the live child's load error
    assert registered(sessions) == [("kept", 1)]
    assert presence_rows(sessions) == [("live/1/cpu:0/b", "kept", 1)]
    assert read(sessions, ended).status == JobStatus.CANCELED.value  # ended jobs stay readable
    with sessions() as session, pytest.raises(ModelNotFound, match="no model named 'old'"):
        registry.resolve(session=session, name="old")


def test_unregister_one_version_keeps_the_others(sessions: Sessions) -> None:
    register(sessions, "m", 1, 2)
    report(sessions, "live/1/cpu:0/b", ("m", 2, PresenceState.LOADED), at=utcnow())

    assert unregister(sessions, "m", version=1).versions == [1]

    assert registered(sessions) == [("m", 2)]
    assert presence_rows(sessions) == [("live/1/cpu:0/b", "m", 2)]


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("nope", None, "model: no model named 'nope' is registered; models: m"),
        ("m", 7, "version: model 'm' has no version 7; its versions: [1]"),
    ],
)
def test_unregister_refuses_an_unknown_model_or_version(
    sessions: Sessions, name: str, version: int | None, message: str
) -> None:
    register(sessions, "m", 1)
    with pytest.raises(ModelNotFound) as raised:
        unregister(sessions, name, version=version)
    assert message in str(raised.value)
    assert registered(sessions) == [("m", 1)]


@pytest.mark.parametrize(
    "state", [PresenceState.LOADING, PresenceState.LOADED, PresenceState.DRAINING]
)
def test_unregister_refuses_while_a_live_child_holds_it(
    sessions: Sessions, make_jobs: MakeJobs, state: PresenceState
) -> None:
    register(sessions, "m", 1, 2)
    queued = make_jobs(model="m", version=2)
    report(sessions, "live/1/cpu:0/b", ("m", 2, state), at=utcnow())

    with pytest.raises(Conflict) as raised:
        unregister(sessions, "m", cancel=True)

    assert f"m:2 ({state.value}) on live" in str(raised.value)
    assert "remove m from the model repository on every worker host and run " \
        "`tffleet models reload` first" in str(raised.value)  # fmt: skip
    # Nothing half-done: every version, presence row and job as it was.
    assert registered(sessions) == [("m", 1), ("m", 2)]
    assert len(presence_rows(sessions)) == 1
    assert read(sessions, queued[0]).status == JobStatus.QUEUED.value
    # Version 1 alone is not held: it may go.
    assert unregister(sessions, "m", version=1).versions == [1]


def test_unregister_refuses_while_jobs_are_unfinished_naming_how_many(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    register(sessions, "m", 1)
    ids = make_jobs(3, model="m")
    with sessions.begin() as session:
        jobs.claim(session=session, job_ids=ids[:1], owner="w", lease_s=60)

    with pytest.raises(Conflict, match="m has 2 queued and 1 running jobs; pass --cancel"):
        unregister(sessions, "m")

    assert registered(sessions) == [("m", 1)]
    assert [read(sessions, i).status for i in ids] == ["running", "queued", "queued"]


def test_unregister_with_cancel_cancels_them_as_a_client_would(
    sessions: Sessions, make_jobs: MakeJobs
) -> None:
    register(sessions, "m", 1)
    register(sessions, "other", 1)
    ids = make_jobs(2, model="m")
    other = make_jobs(model="other")
    with sessions.begin() as session:
        tenants.ensure_tenant(session=session, name=DEFAULT_TENANT)
        hooked = jobs.create(
            session=session,
            jobs=[
                jobs.NewJob(
                    model="m",
                    version=1,
                    samples=1,
                    inputs=b"in",
                    webhook="https://example.com/hook",
                    webhook_events=webhooks.bits(["completed"]),
                )
            ],
        )[0].id
        jobs.claim(session=session, job_ids=ids[:1], owner="w", lease_s=60)

    done = unregister(sessions, "m", cancel=True)

    assert done.canceled == {"running": 1, "queued": 2}
    assert registry.jobs_phrase(done.canceled) == "2 queued and 1 running jobs"
    assert {read(sessions, i).status for i in [*ids, hooked]} == {JobStatus.CANCELED.value}
    assert read(sessions, ids[0]).lease_owner is None  # a late result is fenced out
    assert read(sessions, other[0]).status == JobStatus.QUEUED.value
    with sessions() as session:
        sent = session.scalars(select(WebhookDelivery.job_id)).all()
        assert sent == [hooked]
        assert session.scalar(select(func.count()).select_from(ModelVersion)) == 1
