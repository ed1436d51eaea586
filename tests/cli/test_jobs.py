"""`tffleet submit` and `tffleet status` against `tffleet api` in a subprocess (`served`, with
`FakeWorker` playing its worker; tests/client/fleet.py), and their refusals of bad input files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.client.fleet import FakeWorker, Served, samples
from tffleet.cli import main
from tffleet.cli.process_group import free_port


@pytest.mark.slow
def test_cli_submit_wait_prints_the_finished_job_as_json(
    served: Served, worker: FakeWorker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = samples(2)
    np.save(tmp_path / "x.npy", x)
    worker.serve("double")
    assert main(["submit", "double", str(tmp_path / "x.npy"), "--wait", "--url", served.url]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    job = orjson.loads(line)
    assert job["status"] == "succeeded" and job["model"] == "double"
    np.testing.assert_allclose(job["outputs"]["y"], x * 2)

    assert main(["status", job["id"], "--url", served.url]) == 0
    assert orjson.loads(capsys.readouterr().out)["id"] == job["id"]


@pytest.mark.slow
def test_cli_submit_split_sends_one_job_a_sample_and_saves_the_batch_back(
    served: Served,
    worker: FakeWorker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = samples(5)
    np.savez(tmp_path / "in.npz", x=x)
    worker.serve("double")
    monkeypatch.setenv("TFFLEET_URL", served.url)
    out = tmp_path / "out.npz"
    assert (
        main(["submit", "double", str(tmp_path / "in.npz"), "--split", "--output", str(out)]) == 0
    )
    assert "saved the outputs of 5 job(s)" in capsys.readouterr().err
    with np.load(out) as saved:
        np.testing.assert_array_equal(saved["y"], x * 2)
        np.testing.assert_array_equal(saved["argmax"], [3] * 5)

    # Without --wait: the ids, one a line, in order.
    assert main(["submit", "double", str(tmp_path / "in.npz"), "--split"]) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == 5 and ids == sorted(ids)
    assert main(["status", *ids, "--wait", "20"]) == 0
    statuses = [orjson.loads(line)["status"] for line in capsys.readouterr().out.splitlines()]
    assert statuses == ["succeeded"] * 5


@pytest.mark.slow
def test_cli_status_shows_where_a_queued_job_stands(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    from tffleet.client.sync import Client

    with Client(served.url) as client:  # no worker serves it: the jobs stay queued
        first, second = (client.submit("double", samples(1)) for _ in range(2))
        try:
            assert main(["status", first.id, second.id, "--url", served.url]) == 0
        finally:
            for job in (first, second):
                client.cancel(job.id)
    shown = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]

    assert [job["status"] for job in shown] == ["queued", "queued"]
    assert shown[1]["queue_position"] == shown[0]["queue_position"] + 1
    assert all("eta_s" in job for job in shown)


@pytest.mark.slow
def test_cli_submit_reports_what_the_api_refused(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.json").write_text('{"x": [[1, 2, 3]]}')
    assert main(["submit", "double", str(tmp_path / "in.json"), "--url", served.url]) == 1
    assert "422 invalid_input: inputs.x: dimension 1 must be 4" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.npy", None, "missing.npy: no such file"),
        ("x.txt", b"1 2 3", "x.txt: expected a .npy, .npz or .json file"),
        ("broken.npy", b"not numpy", "broken.npy: not a valid .npy file"),
        ("broken.npz", b"not a zip", "broken.npz: not a valid .npz file"),
        ("broken.json", b"{", "broken.json: not a valid .json file"),
    ],
)
def test_cli_submit_of_a_bad_file_says_which_and_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: bytes | None,
    message: str,
) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content)
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert main(["submit", "double", str(tmp_path / name), "--url", unreachable]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tffleet: ") and message in err


def test_cli_submit_split_needs_a_batch_and_output_needs_npz(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scalar.json").write_text('{"x": 3}')
    assert main(["submit", "double", str(tmp_path / "scalar.json"), "--split"]) == 2
    assert "--split needs tensors with a batch dimension" in capsys.readouterr().err
    np.save(tmp_path / "x.npy", samples(1))
    assert main(["submit", "double", str(tmp_path / "x.npy"), "--output", "out.csv"]) == 2
    assert "--output must name a .npz file" in capsys.readouterr().err
