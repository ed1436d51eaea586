"""`tffleet status ID --follow`: a line per change of the job's status, until it ends, against
`tffleet api` in a subprocess (`served`, with `FakeWorker` playing its worker)."""

from __future__ import annotations

import orjson
import pytest

from tests.client.fleet import FakeWorker, Served, samples
from tffleet.cli import main


@pytest.mark.slow
def test_cli_status_follow_prints_a_line_per_change_until_the_job_ends(
    served: Served, worker: FakeWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    from tffleet.client.sync import Client

    with Client(served.url) as client:
        ok = client.submit("double", samples(1))
        failing = client.submit("pair", {"a": [[1.0, 2.0, 3.0]], "b": [[1, 2]]})
    worker.serve("double", delay_s=0.5)
    worker.serve("pair", delay_s=0.5, fail="boom")

    assert main(["status", ok.id, "--follow", "--url", served.url]) == 0
    shown = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [job["status"] for job in shown] == ["queued", "succeeded"]
    assert shown[-1]["outputs"]["y"] == [[v * 2 for v in row] for row in samples(1).tolist()]

    # A job that fails: its lines, and exit status 1.
    assert main(["status", failing.id, "--follow", "--url", served.url]) == 1
    shown = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert shown[-1]["status"] == "failed" and shown[-1]["error"]["message"] == "boom"


def test_cli_status_follow_takes_one_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "j1", "j2", "--follow"]) == 2
    assert "--follow follows one job" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: not with --wait
        main(["status", "j1", "--follow", "--wait", "5"])
