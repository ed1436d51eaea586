"""The settings file `tffleet up` leaves for other commands run in its directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tffleet.cli.up import _reachable
from tffleet.fleet_env import FLEET_ENV, running_fleet_env


def write(data_dir: Path, pid: int) -> None:
    data_dir.mkdir()
    (data_dir / FLEET_ENV).write_text(
        f"# comment\nTFFLEET_UP_PID={pid}\nTFFLEET_DATABASE_URL=sqlite:////x/tffleet.db\n"
    )


def test_the_settings_of_a_running_up_are_found(tmp_path: Path) -> None:
    write(tmp_path / ".tffleet", os.getpid())

    assert running_fleet_env(tmp_path / ".tffleet") == {
        "TFFLEET_DATABASE_URL": "sqlite:////x/tffleet.db"
    }


@pytest.mark.slow  # starts a process
def test_a_file_left_by_an_up_that_was_killed_is_ignored(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write(tmp_path / ".tffleet", gone.pid)

    assert running_fleet_env(tmp_path / ".tffleet") == {}
    assert running_fleet_env(tmp_path / "nothing-here") == {}


@pytest.mark.parametrize(
    ("bound", "reached"),
    [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("::", "[::1]"), ("::1", "[::1]")],
)
def test_the_url_other_commands_use_reaches_the_api_where_it_is_bound(
    bound: str, reached: str
) -> None:
    assert _reachable(bound) == reached
