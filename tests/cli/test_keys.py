"""`tffleet keys`: make a key (shown once, alone on the last line), list keys, revoke one."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import tenants
from db.key_limits import KeyLimits
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


def test_a_sqlite_file_that_is_not_there_is_reported_and_not_made(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Run from another directory than `tffleet up`'s, a command must not leave an empty
    database behind it."""
    from tffleet.settings import get_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFFLEET_DATABASE_URL", "sqlite:///tffleet.db")
    get_settings.cache_clear()
    try:
        assert main(["keys", "list"]) == 1
        assert main(["usage"]) == 1
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert "no database at tffleet.db; run this where `tffleet up` runs" in err
    assert list(tmp_path.iterdir()) == []


# A key's limits: create and set take them, list shows them, `none` takes one off


def test_create_takes_limits_and_the_key_carries_them(
    database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    key = create(
        capsys, "--tenant", "acme", "--rate", "5", "--burst", "10", "--max-active-jobs", "100",
        "--models", "mlp, pair",
    )  # fmt: skip

    with sessions() as session:
        caller = tenants.authenticate(session=session, key=key)
    assert caller is not None
    assert caller.limits == KeyLimits(5.0, 10, 100, frozenset({"mlp", "pair"}))
    assert main(["keys", "list"]) == 0
    listed = capsys.readouterr().out
    assert "RATE/S" in listed and "MAX ACTIVE" in listed
    assert " 5 " in listed and " 10 " in listed and " 100 " in listed and "mlp,pair" in listed


@pytest.mark.both_databases
def test_set_changes_only_the_limits_given_and_none_takes_one_off(
    database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    key = create(capsys, "--tenant", "acme", "--rate", "5", "--models", "mlp")
    prefix = key.split("_")[1]

    assert main(["keys", "set", prefix, "--max-active-jobs", "3", "--burst", "7"]) == 0
    assert "rate 5/s burst 7, at most 3 active, models mlp" in capsys.readouterr().out
    assert main(["keys", "set", key, "--models", "none", "--rate", "2.5", "--burst", "none"]) == 0
    assert "rate 2.5/s burst 3, at most 3 active, every model" in capsys.readouterr().out
    assert main(["keys", "set", prefix, "--rate", "none", "--max-active-jobs", "none"]) == 0
    assert "no rate, no cap, every model" in capsys.readouterr().out

    with sessions() as session:
        caller = tenants.authenticate(session=session, key=key)
    assert caller is not None and caller.limits == KeyLimits()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--burst", "5"], "burst: a burst needs a rate"),
        (["--rate", "5000000"], "rate: jobs a second, above 0 and at most 1e+06"),
        (["--rate", "1", "--burst", "2000000"], "burst: between 1 and 1000000"),
    ],
)
def test_a_limit_out_of_range_is_a_usage_error_that_changes_nothing(
    database: str,
    sessions: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    key = create(capsys, "--tenant", "acme")

    assert main(["keys", "set", key, *args]) == 2
    assert message in capsys.readouterr().err
    assert main(["keys", "create", "--tenant", "acme", *args]) == 2
    with sessions() as session:
        assert len(tenants.list_keys(session=session)) == 1  # the one made above, unlimited
        caller = tenants.authenticate(session=session, key=key)
    assert caller is not None and caller.limits == KeyLimits()


@pytest.mark.parametrize(
    "args", [["--rate", "0"], ["--rate", "fast"], ["--burst", "0"], ["--models", "a,,b"]]
)
def test_a_value_that_is_no_limit_is_refused_naming_the_option(
    database: str, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["keys", "set", "0123456789ab", *args])

    assert exited.value.code == 2
    assert f"argument {args[0]}:" in capsys.readouterr().err


def test_set_without_a_limit_or_of_an_unknown_key_fails(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "set", "0123456789ab"]) == 2
    assert "name at least one limit" in capsys.readouterr().err
    assert main(["keys", "set", "0123456789ab", "--rate", "1"]) == 1
    assert "no API key with prefix '0123456789ab'" in capsys.readouterr().err
