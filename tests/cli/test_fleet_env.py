"""The settings file `tffleet up` leaves for other commands run in its directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_a_file_left_by_an_up_that_was_killed_is_ignored(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write(tmp_path / ".tffleet", gone.pid)

    assert running_fleet_env(tmp_path / ".tffleet") == {}
    assert running_fleet_env(tmp_path / "nothing-here") == {}
