"""`tffleet flower`: installed with tffleet, against the fleet's Redis, behind its password."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tffleet.cli import main
from tffleet.cli.process_group import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def flower(redis_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_FLOWER_BASIC_AUTH": "ops:s3cret-for-the-test",
    }
    log = tmp_path / "flower.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "flower", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        yield url
        assert b"s3cret" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_flower_answers_with_its_password_and_refuses_without(flower: str) -> None:
    refused = httpx.get(f"{flower}/api/tasks", timeout=10)
    answered = httpx.get(f"{flower}/api/tasks", auth=("ops", "s3cret-for-the-test"), timeout=10)

    assert refused.status_code == 401
    assert answered.status_code == 200
    assert answered.json() == {}  # no task seen yet; the API works


def test_flower_refuses_to_start_without_a_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TFFLEET_FLOWER_BASIC_AUTH", raising=False)

    assert main(["flower"]) == 2
    assert "TFFLEET_FLOWER_BASIC_AUTH" in capsys.readouterr().err


def test_flower_missing_names_the_package_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TFFLEET_FLOWER_BASIC_AUTH", "ops:s3cret-for-the-test")
    monkeypatch.setitem(sys.modules, "flower", None)  # importlib finds no `flower` package

    assert main(["flower"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'flower>=2.0'" in err
    assert "No such command" not in err
