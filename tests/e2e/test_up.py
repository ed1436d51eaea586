"""`tffleet up`, the embedded default, run as a new user would run it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tffleet.cli.process_group import free_port

pytestmark = pytest.mark.slow


def _descendants(pid: int) -> set[int]:
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        parent = re.search(r"^PPid:\s+(\d+)", text, re.M)
        if parent and int(parent.group(1)) == pid:
            child = int(status.parent.name)
            found |= {child} | _descendants(child)
    return found


def _start_up(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path, int]:
    """`tffleet up` on a free port in `tmp_path`, as a new user starts it: the process, its log
    and its port."""
    port = free_port()
    out = tmp_path / "up.log"
    with out.open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "up", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
            env=env,
        )  # fmt: skip
    return up, out, port


def _wait_until_up(up: subprocess.Popen[bytes], out: Path, timeout_s: float = 240) -> None:
    """Until `up` printed that it is up (it builds the example model on a first run)."""
    deadline = time.monotonic() + timeout_s
    while "Ctrl-C stops everything" not in out.read_text(errors="replace"):
        assert up.poll() is None, out.read_text(errors="replace")[-4000:]
        assert time.monotonic() < deadline, out.read_text(errors="replace")[-4000:]
        time.sleep(0.3)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_up_builds_the_example_model_serves_its_curl_example_and_ctrl_c_or_sigterm_stops_all(
    tmp_path: Path, stop: signal.Signals
) -> None:
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("TFFLEET_")}
    up, out, port = _start_up(tmp_path, clean_env)
    try:
        _wait_until_up(up, out)
        printed = out.read_text(errors="replace")
        body = re.search(r"-d '(\{.*\})'", printed)
        auth = re.search(r"-H 'Authorization: (Bearer tff_[0-9a-f]{12}_\S{43})'", printed)
        assert body and auth, printed[-2000:]
        assert f"http://127.0.0.1:{port}/v1/jobs" in printed
        started = _descendants(up.pid)
        data_dir = tmp_path / ".tffleet"
        for secret in ("admin.key", "fleet.env", "redis.conf"):
            assert (data_dir / secret).stat().st_mode & 0o077 == 0, (
                f"{secret} is readable by others"
            )
        assert auth.group(1) == f"Bearer {(data_dir / 'admin.key').read_text().strip()}"

        # The printed example, sent as curl would send it; without the key it is refused.
        submit = {"content": body.group(1), "url": f"http://127.0.0.1:{port}/v1/jobs"}
        refused = httpx.post(**submit, headers={"Content-Type": "application/json"})
        assert refused.status_code == 401, refused.text
        submitted = httpx.post(
            **submit, headers={"Content-Type": "application/json", "Authorization": auth.group(1)}
        )
        assert submitted.status_code == 202, submitted.text
        job = httpx.get(
            f"http://127.0.0.1:{port}/v1/jobs/{submitted.json()['id']}",
            params={"wait": 30},
            headers={"Authorization": auth.group(1)},
            timeout=40,
        ).json()
        assert job["status"] == "succeeded", job
        assert len(job["outputs"]["output_0"][0]) == 3

        # Another tffleet command run in the same directory finds this fleet by itself.
        listed = subprocess.run(
            [sys.executable, "-m", "tffleet.cli", "models", "list"],
            cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert "example" in listed.stdout and "using the fleet of `tffleet up`" in listed.stderr

        # So does a script: tffleet.Client() finds the URL and the key with no arguments.
        script = f"import tffleet; print(tffleet.Client().get({job['id']!r}).status)"
        polled = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert polled.stdout.strip() == "succeeded", polled.stderr
    finally:
        up.send_signal(stop)
        code = up.wait(timeout=60)
    assert code == 0, out.read_text(errors="replace")[-3000:]
    assert not (tmp_path / ".tffleet" / "fleet.env").exists()
    assert started, "tffleet up started no processes?"
    leftovers = [pid for pid in started if Path(f"/proc/{pid}").exists()]
    assert leftovers == [], f"processes left running after {stop.name}: {leftovers}"


def _worker_pids(up_pid: int) -> set[int]:
    """The worker main processes `tffleet up` started (its own children, not theirs)."""
    found = set()
    for pid in _descendants(up_pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PPid:\t{up_pid}\n" in status and argv[-3:-1] == [b"tffleet.cli", b"worker"]:
            found.add(pid)
    return found


def test_a_worker_drained_by_sigterm_is_started_again_and_runs_the_next_job(
    tmp_path: Path,
) -> None:
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("TFFLEET_")}
    up, out, port = _start_up(tmp_path, clean_env)
    started: set[int] = set()
    try:
        _wait_until_up(up, out)
        printed = out.read_text(errors="replace")
        named = re.search(r"`kill -TERM (\d+)` drains the worker", printed)
        assert named, printed[-2000:]
        old_worker = int(named.group(1))
        assert _worker_pids(up.pid) == {old_worker}
        started = _descendants(up.pid)

        os.kill(old_worker, signal.SIGTERM)  # the documented drain
        deadline = time.monotonic() + 120
        while not (new_workers := _worker_pids(up.pid) - {old_worker}):
            assert up.poll() is None, out.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, out.read_text(errors="replace")[-4000:]
            time.sleep(0.3)
        assert not Path(f"/proc/{old_worker}").exists()
        printed = out.read_text(errors="replace")
        assert f"worker (pid {old_worker}) exited with status 0; starting it again" in printed
        assert f"worker started again (pid {min(new_workers)})" in printed
        started |= _descendants(up.pid)

        # A job submitted now runs on the new worker (it loads the model first).
        auth = {
            "Authorization": f"Bearer {(tmp_path / '.tffleet' / 'admin.key').read_text().strip()}"
        }
        submitted = httpx.post(
            f"http://127.0.0.1:{port}/v1/jobs",
            json={"model": "example", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}},
            headers=auth,
        )
        assert submitted.status_code == 202, submitted.text
        deadline = time.monotonic() + 180
        while True:
            job = httpx.get(
                f"http://127.0.0.1:{port}/v1/jobs/{submitted.json()['id']}",
                params={"wait": 20},
                headers=auth,
                timeout=30,
            ).json()
            if job["status"] not in ("queued", "running") or time.monotonic() > deadline:
                break
        assert job["status"] == "succeeded", job
        started |= _descendants(up.pid)
        assert up.poll() is None
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=90)
    assert code == 0, out.read_text(errors="replace")[-3000:]
    leftovers = [pid for pid in started if Path(f"/proc/{pid}").exists()]
    assert leftovers == [], f"processes left running after Ctrl-C: {leftovers}"
