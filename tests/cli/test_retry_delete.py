"""`tffleet submit --cancel-after`, `tffleet retry` and `tffleet delete` against `tffleet api` in a
subprocess (`served`, with `FakeWorker` playing its worker; tests/client/fleet.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.client.fleet import FakeWorker, Served, samples
from tffleet import Client
from tffleet.cli import main


@pytest.mark.slow
def test_cli_submit_with_cancel_after_then_retry_and_delete(
    served: Served, worker: FakeWorker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", samples(1))
    x, url = str(tmp_path / "x.npy"), ["--url", served.url]

    assert main(["submit", "double", x, "--cancel-after", "soon", *url]) == 1
    assert "422 invalid_input: Cancel-After:" in capsys.readouterr().err

    assert main(["submit", "double", x, "--cancel-after", "5m", *url]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main(["delete", job_id, *url]) == 1
    assert "cancel it first" in capsys.readouterr().err
    assert main(["retry", job_id, *url]) == 1
    assert "is queued" in capsys.readouterr().err

    with Client(served.url, api_key=served.api_key) as client:
        assert client.get(job_id).deadline_at is not None
        client.cancel(job_id)
    assert main(["retry", job_id, "--cancel-after", "1h30m", *url]) == 0
    retried = orjson.loads(capsys.readouterr().out)
    assert retried["id"] == job_id and retried["status"] == "queued"
    assert retried["deadline_at"] is not None

    worker.finish([job_id])
    assert main(["delete", job_id, *url]) == 0
    assert f"deleted job {job_id}" in capsys.readouterr().err
    assert main(["status", job_id, *url]) == 1
    assert "404" in capsys.readouterr().err
