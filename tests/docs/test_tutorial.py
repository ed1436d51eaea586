"""The tutorial (docs/tutorial.md), run as a newcomer runs it, so that it cannot fall behind.

Every ```bash and ```python block runs in order, as pasted into a second terminal at the root of
the checkout while `make run` goes on in the first: here, a `tffleet up` that this module starts
from the venv (as `make run` does) in a directory of its own, with no TFFLEET_* setting, so
that the blocks find the fleet as a newcomer's do (`.tffleet/fleet.env`, `.tffleet/admin.key`).
The blocks name the API as http://127.0.0.1:8000; the fleet here listens on a free port, which
replaces 8000 in them. A block after `<!-- not-run -->` is shown only: the `make run` that the
fleet stands for, and nothing else.

Each block runs on its own (a bash block with `set -euo pipefail`, a Python block as a script),
within BLOCK_TIMEOUT_S. A bash block fails on a non-zero exit and on an error answer of the API
in its output; a Python block on a non-zero exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tffleet.cli.process_group import free_port

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
NOT_RUN = "<!-- not-run -->"
DOCUMENTED_URL = "http://127.0.0.1:8000"
BLOCK_TIMEOUT_S = 120
UP_TIMEOUT_S = 300  # the example model is built and loaded before `tffleet up` says it is up
UP_READY = "Ctrl-C stops everything"
# What the API answers an error with; a job that failed shows the same (`"error":{"code"...`).
API_ERROR = re.compile(r'"error":\s*\{')


@dataclass(frozen=True)
class Block:
    line: int  # where its fence opens in the tutorial, 1-based
    language: str  # "bash" or "python"
    code: str
    run: bool

    def __str__(self) -> str:
        return f"docs/tutorial.md:{self.line} ({self.language})"


def blocks(text: str) -> list[Block]:
    """The bash and python blocks of a Markdown text, in order; other fences are prose."""
    found: list[Block] = []
    lines = text.splitlines()
    previous = ""  # the last non-blank line before the current one
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)\s*", lines[i])
        if fence is None:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```")
        if fence.group(1) in ("bash", "python"):
            code = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(i + 1, fence.group(1), code, run=previous != NOT_RUN))
        previous = ""
        i = end + 1
    return found


def test_the_tutorial_starts_with_make_run_and_runs_every_other_block() -> None:
    shown = blocks(TUTORIAL.read_text())
    assert shown and shown[0].code.strip() == "make run" and not shown[0].run, shown[:1]
    skipped = [str(block) for block in shown[1:] if not block.run]
    assert skipped == [], f"only the server start may be left unrun: {skipped}"
    assert {block.language for block in shown} == {"bash", "python"}


def test_no_tutorial_block_waits_by_sleeping() -> None:
    """A block that waits on a job long-polls (`?wait=`) or lets the client wait: a sleep is a
    guess that a slower machine proves wrong."""
    sleepers = [str(b) for b in blocks(TUTORIAL.read_text()) if re.search(r"\bsleep\b", b.code)]
    assert sleepers == []


@dataclass
class Up:
    directory: Path
    port: int
    env: dict[str, str]
    log: Path


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    directory = tmp_path_factory.mktemp("tutorial")
    log = directory.parent / f"{directory.name}-up.log"  # not in the newcomer's directory
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFFLEET_")}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    tffleet = venv_bin / "tffleet"
    command = [str(tffleet)] if tffleet.exists() else [sys.executable, "-m", "tffleet.cli"]
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "up", "--port", str(port)],
            cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while UP_READY not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`tffleet up` did not come up:\n{log.read_text()[-4000:]}")
            time.sleep(0.3)
        yield Up(directory, port, env, log)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: `tffleet up` stops everything it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_block(block: Block, up: Up) -> subprocess.CompletedProcess[str]:
    code = block.code.replace(DOCUMENTED_URL, f"http://127.0.0.1:{up.port}")
    if block.language == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", code]
    else:
        argv = [sys.executable, "-c", code]
    return subprocess.run(
        argv, cwd=up.directory, env=up.env, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=BLOCK_TIMEOUT_S,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(UP_TIMEOUT_S + 10 * BLOCK_TIMEOUT_S)
def test_every_block_of_the_tutorial_runs_against_a_live_tffleet_up(up: Up) -> None:
    run_every_block(TUTORIAL, up)


def run_every_block(tutorial: Path, up: Up) -> None:
    """Each block of `tutorial` to run, in order, against `up`: each must exit 0 within
    BLOCK_TIMEOUT_S, and a bash block's output must hold no error answer of the API."""
    for block in (block for block in blocks(tutorial.read_text()) if block.run):
        try:
            done = run_block(block, up)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{block} ran past {BLOCK_TIMEOUT_S}s; its output: {exc.output!r}")
        said = f"{block}:\n{block.code}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-3000:]}"
        assert done.returncode == 0, f"exit status {done.returncode} of {said}"
        if block.language == "bash":
            assert not API_ERROR.search(done.stdout), f"an error answer in {said}"
