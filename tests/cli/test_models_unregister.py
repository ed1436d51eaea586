"""`tffleet models unregister`: its exit statuses and messages, against a real database (the
refusals' SQL is tested in tests/db/test_unregister.py; tests/e2e/test_unregister.py takes a model
out of a live fleet)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, presence, registry, tenants
from db.clock import utcnow
from db.models import DEFAULT_TENANT, JobStatus, PresenceState
from tffleet.cli import main

Sessions = sessionmaker[Session]
SIGNATURE = {"x": {"dtype": "float32", "shape": [-1, 4]}}


@pytest.fixture
def example(database: str, sessions: Sessions) -> list[str]:
    """Model `example`, versions 1 and 2, with three queued jobs of version 2; their ids."""
    with sessions.begin() as session:
        for version in (1, 2):
            registry.register(
                session=session,
                name="example",
                version=version,
                format="saved_model",
                inputs=SIGNATURE,
                outputs=SIGNATURE,
            )
        tenants.ensure_tenant(session=session, name=DEFAULT_TENANT)
        new = [jobs.NewJob(model="example", version=2, samples=1, inputs=b"in")] * 3
        return [row.id for row in jobs.create(session=session, jobs=new)]


def statuses(sessions: Sessions, ids: list[str]) -> set[str]:
    with sessions() as session:
        return {jobs.get(session=session, job_id=i).status for i in ids}


def test_unregister_with_cancel_takes_every_version_off_the_list(
    example: list[str], sessions: Sessions, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "unregister", "example", "--cancel"]) == 0

    out = capsys.readouterr().out
    assert out == "tffleet: unregistered example:1, example:2 (3 queued jobs canceled)\n"
    assert statuses(sessions, example) == {JobStatus.CANCELED.value}
    assert main(["models", "list"]) == 0
    assert "example" not in capsys.readouterr().out


def test_unregister_one_version_without_jobs(
    example: list[str], sessions: Sessions, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "unregister", "example", "--version", "1"]) == 0

    assert capsys.readouterr().out == "tffleet: unregistered example:1\n"
    with sessions() as session:
        assert [m.version for m in registry.list_versions(session=session)] == [2]
    assert statuses(sessions, example) == {JobStatus.QUEUED.value}


def test_unregister_refuses_while_jobs_are_queued(
    example: list[str], sessions: Sessions, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "unregister", "example"]) == 2

    err = capsys.readouterr().err
    assert "example has 3 queued jobs; pass --cancel to cancel them" in err
    with sessions() as session:
        assert len(registry.list_versions(session=session)) == 2
    assert statuses(sessions, example) == {JobStatus.QUEUED.value}


def test_unregister_refuses_while_a_live_worker_holds_it(
    example: list[str], sessions: Sessions, capsys: pytest.CaptureFixture[str]
) -> None:
    now = utcnow()
    with sessions.begin() as session:
        presence.report(
            session=session,
            child=presence.Child(id="h/1/cpu:0/x", host="h", pid=1, device="cpu:0"),
            holdings=[presence.Holding("example", 1, PresenceState.LOADED, "/m/example/1", now)],
        )

    assert main(["models", "unregister", "example", "--version", "1"]) == 2

    err = capsys.readouterr().err
    assert "example:1 (loaded) on h" in err
    assert (
        "remove example from the model repository on every worker host and run "
        "`tffleet models reload` first" in err
    )
    with sessions() as session:
        assert len(registry.list_versions(session=session)) == 2


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["exampel"], "no model named 'exampel' is registered; models: example"),
        (["example", "--version", "9"], "model 'example' has no version 9; its versions: [1, 2]"),
    ],
)
def test_unregister_an_unknown_model_or_version_names_those_there_are(
    example: list[str], capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert main(["models", "unregister", *argv]) == 2
    assert expected in capsys.readouterr().err


def test_unregister_without_a_database_is_exit_status_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tffleet.settings import get_settings

    monkeypatch.setenv("TFFLEET_DATABASE_URL", f"sqlite:///{tmp_path}/empty.db")
    get_settings.cache_clear()
    try:
        assert main(["models", "unregister", "example"]) == 1
    finally:
        get_settings.cache_clear()
    assert f"no database at {tmp_path}/empty.db" in capsys.readouterr().err
