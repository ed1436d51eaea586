"""`tffleet submit --webhook URL --webhook-events start,completed` against `tffleet api` in a
subprocess (`served`; tests/client/fleet.py): each job is stored with its webhook."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from db.engine import make_engine, make_sessionmaker
from db.models import Job
from tests.client.fleet import Served, samples
from tffleet.cli import main

PUBLIC = "https://93.184.216.34/hooks"


def stored(database_url: str, job_ids: list[str]) -> set[tuple[str | None, int | None]]:
    engine = make_engine(database_url)
    with make_sessionmaker(engine)() as session:
        jobs = session.scalars(select(Job).where(Job.id.in_(job_ids))).all()
    engine.dispose()
    assert len(jobs) == len(job_ids)
    return {(job.webhook, job.webhook_events) for job in jobs}


@pytest.mark.slow
def test_cli_submit_with_a_webhook_one_job_and_split(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", samples(3))
    x, url = str(tmp_path / "x.npy"), ["--url", served.url]

    assert main(["submit", "double", x, "--webhook", PUBLIC, *url]) == 0
    assert stored(served.database_url, [capsys.readouterr().out.strip()]) == {(PUBLIC, 2)}

    both = ["--webhook", PUBLIC, "--webhook-events", "start,completed"]
    assert main(["submit", "double", x, "--split", *both, *url]) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == 3 and stored(served.database_url, ids) == {(PUBLIC, 3)}

    assert main(["submit", "double", x, "--webhook", "ftp://example.com/", *url]) == 1
    assert "422 invalid_input: webhook" in capsys.readouterr().err
    assert main(["submit", "double", x, "--webhook", PUBLIC, "--webhook-events", "end", *url]) == 1
    assert "422 invalid_input: webhook_events" in capsys.readouterr().err


def test_cli_submit_webhook_events_need_a_webhook_and_an_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", samples(1))
    x = str(tmp_path / "x.npy")
    assert main(["submit", "double", x, "--webhook-events", "start"]) == 2
    assert "--webhook-events needs --webhook" in capsys.readouterr().err
    assert main(["submit", "double", x, "--webhook", PUBLIC, "--webhook-events", ","]) == 2
    assert "--webhook-events: expected start, completed" in capsys.readouterr().err
