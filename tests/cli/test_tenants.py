"""`tffleet tenants`: a tenant's own quotas over the fleet's defaults, set and listed."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import tenants
from db.tenants import Limits
from tffleet.cli import main
from tffleet.settings import Settings


def limits_of(sessions: sessionmaker[Session], name: str) -> Limits:
    with sessions() as session:
        return tenants.limits(session=session, name=name, defaults=Limits.defaults(Settings()))


def test_set_changes_only_the_limits_named_and_default_puts_one_back(
    database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tenants", "set", "acme", "--max-queued-jobs", "500", "--max-priority", "3"]) == 0
    assert main(["tenants", "set", "acme", "--max-samples-per-job", "64", "--weight", "3"]) == 0
    assert main(["tenants", "set", "acme", "--max-priority", "default"]) == 0

    found = limits_of(sessions, "acme")
    assert (found.max_queued_jobs, found.max_samples_per_job, found.max_priority) == (500, 64, 10)
    assert found.weight == 3
    assert "max_samples_per_job 64" in capsys.readouterr().out


def test_list_shows_every_tenant_with_the_limits_in_force(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tenants", "set", "acme", "--max-queued-jobs", "0"]) == 0
    capsys.readouterr()

    assert main(["tenants", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[0] == "TENANT"
    acme = next(line for line in out if line.startswith("acme"))
    assert "no limit" in acme and "65536" in acme
    assert any(line.startswith("default") for line in out)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-priority", "5000"], "max_priority: between -1000 and 1000, got 5000"),
        (["--max-samples-per-job", "0"], "max_samples_per_job: between 1 and"),
        ([], "name at least one limit"),
    ],
)
def test_a_value_out_of_range_or_none_at_all_is_a_usage_error(
    database: str, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    assert main(["tenants", "set", "acme", *args]) == 2
    assert expected in capsys.readouterr().err
