"""`tffleet keys`: make a key (shown once, alone on the last line), list keys, revoke one."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import tenants
from tffleet.cli import main


def create(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["keys", "create", *args]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_create_prints_a_working_key_alone_on_the_last_line(
    database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    key = create(capsys, "--tenant", "acme", "--note", "the web app")

    with sessions() as session:
        caller = tenants.authenticate(session=session, key=key)
    assert caller is not None and (caller.tenant, caller.admin) == ("acme", False)


def test_an_admin_key_says_so(
    database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    key = create(capsys, "--tenant", "ops", "--admin")

    with sessions() as session:
        caller = tenants.authenticate(session=session, key=key)
    assert caller is not None and caller.admin


def test_list_shows_prefixes_never_secrets(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    key = create(capsys, "--tenant", "acme", "--note", "the web app")

    assert main(["keys", "list"]) == 0
    out = capsys.readouterr().out
    assert key.split("_")[1] in out and "acme" in out and "the web app" in out
    assert key not in out and key.split("_", 2)[2] not in out


def test_revoke_by_prefix_or_whole_key_stops_the_key(
    database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = create(capsys, "--tenant", "acme"), create(capsys, "--tenant", "acme")

    assert main(["keys", "revoke", first.split("_")[1]]) == 0
    assert main(["keys", "revoke", second]) == 0
    assert "revoked key" in capsys.readouterr().out
    with sessions() as session:
        assert tenants.authenticate(session=session, key=first) is None
        assert tenants.authenticate(session=session, key=second) is None
    assert main(["keys", "list"]) == 0
    assert capsys.readouterr().out.count(" - ") == 0  # both show when they were revoked


def test_revoke_of_an_unknown_prefix_fails(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "revoke", "0123456789ab"]) == 1
    assert "no API key with prefix '0123456789ab'" in capsys.readouterr().err


def test_a_bad_tenant_name_is_a_usage_error(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "--tenant", "Not A Slug"]) == 2
    assert "tenant 'Not A Slug'" in capsys.readouterr().err


def test_a_database_that_is_not_there_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tffleet.settings import get_settings

    monkeypatch.setenv("TFFLEET_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    get_settings.cache_clear()
    try:
        assert main(["keys", "list"]) == 1
    finally:
        get_settings.cache_clear()
    assert "database error" in capsys.readouterr().err
