"""`tffleet submit --queue-timeout` and `tffleet retry --queue-timeout` against `tffleet api` in a
subprocess (`served`, with `FakeWorker` playing its worker; tests/client/fleet.py)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.client.fleet import FakeWorker, Served, samples
from tffleet.cli import main


@pytest.mark.slow
def test_cli_submit_and_retry_with_a_queue_timeout(
    served: Served, worker: FakeWorker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", samples(1))
    x, url = str(tmp_path / "x.npy"), ["--url", served.url]

    assert main(["submit", "double", x, "--queue-timeout", "soon", *url]) == 1
    assert "422 invalid_input: Queue-Timeout:" in capsys.readouterr().err

    assert main(["submit", "double", x, "--queue-timeout", "10ms", *url]) == 0
    job_id = capsys.readouterr().out.strip()
    time.sleep(0.05)
    assert worker.finish([job_id]) == []  # the claim cancels it instead of starting it
    assert main(["status", job_id, *url]) == 0
    canceled = orjson.loads(capsys.readouterr().out)
    assert canceled["status"] == "canceled" and canceled["error"]["code"] == "queue_timeout"

    assert main(["retry", job_id, "--queue-timeout", "5m", *url]) == 0
    assert orjson.loads(capsys.readouterr().out)["status"] == "queued"
    assert worker.finish([job_id]) == [job_id]
