"""`tffleet usage`: the table `GET /v1/usage` sums, read from the database, and as CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from db import usage
from db.models import UsageRecord
from tffleet.cli import main

Sessions = sessionmaker[Session]

NOW = datetime(2025, 3, 10, 14, 30, tzinfo=UTC)
PERIOD = ["--from", "2025-03-09T15:00", "--to", "2025-03-10T15:00Z"]


@pytest.fixture(autouse=True)
def records(database: str, sessions: Sessions) -> Iterator[None]:
    """Two tenants' records in the period, one before it; none of another test's."""
    with sessions.begin() as session:
        session.execute(delete(UsageRecord))
        for at, tenant, model, device_s in [
            (NOW, "acme", "mlp", 0.5),
            (NOW - timedelta(hours=2), "acme", "cnn", 2.0),
            (NOW - timedelta(hours=20), "zeta", "mlp", 1.25),
            (NOW - timedelta(days=2), "zeta", "mlp", 100.0),
        ]:
            batch = usage.Batch(model)
            batch.add(tenant, ended=True, samples=4, device_s=device_s, queue_s=0.5, run_s=1.0)
            usage.record(session, batch, at=at)
    yield
    with sessions.begin() as session:
        session.execute(delete(UsageRecord))


def test_the_table_has_a_row_per_tenant_and_a_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", *PERIOD]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TENANT", "JOBS", "SAMPLES", "DEVICE_S", "QUEUE_S", "RUN_S"]
    assert lines[1].split() == ["acme", "2", "8", "2.500", "1.000", "2.000"]
    assert lines[2].split() == ["zeta", "1", "4", "1.250", "0.500", "1.000"]
    assert lines[3].split() == ["TOTAL", "3", "12", "3.750", "1.500", "3.000"]


def test_csv_per_model_of_one_tenant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", *PERIOD, "--group-by", "model", "--tenant", "acme", "--csv"]) == 0

    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows == [
        ["model", "jobs", "samples", "device_s", "queue_s", "run_s"],
        ["cnn", "1", "4", "2.000", "0.500", "1.000"],
        ["mlp", "1", "4", "0.500", "0.500", "1.000"],
    ]


def test_per_day(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--from", "2025-03-01", "--to", "2025-03-11", "--group-by", "day"]) == 0

    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines()[1:4]] == [
        ["2025-03-08", "1"],
        ["2025-03-09", "1"],
        ["2025-03-10", "2"],
    ]


def test_a_period_with_no_job_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--from", "2024-01-01", "--to", "2024-01-02"]) == 0
    assert "no job ended" in capsys.readouterr().out


def test_a_time_that_does_not_parse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["usage", "--from", "yesterday"])
    assert exited.value.code == 2
    assert "ISO 8601" in capsys.readouterr().err


def test_a_period_that_ends_before_it_starts_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["usage", "--from", "2025-03-10", "--to", "2025-03-09"]) == 2
    assert "--to: must be after --from" in capsys.readouterr().err
