"""The settings file `tffleet up` leaves while it runs, for what else is started in its directory.

`tffleet up` writes `.tffleet/fleet.env` (the fleet's URL, API key, database and Redis URLs) and
removes it when it stops. `tffleet` commands and `tffleet.Client` started in that directory read
it for any setting the environment does not give: a second terminal needs no copy-pasting. The
file holds secrets, so only its owner may read it.
"""

from __future__ import annotations

import os
from pathlib import Path

FLEET_ENV = "fleet.env"
DEFAULT_DATA_DIR = Path(".tffleet")
DEFAULT_URL = "http://127.0.0.1:8000"


def write_fleet_env(data_dir: Path, env: dict[str, str]) -> Path:
    path = data_dir / FLEET_ENV
    lines = [
        "# The settings of the `tffleet up` running from here; removed when it stops.",
        f"TFFLEET_UP_PID={os.getpid()}",
        *(f"{key}={value}" for key, value in env.items()),
    ]
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("\n".join(lines) + "\n")
    return path


def running_fleet_env(data_dir: Path = DEFAULT_DATA_DIR) -> dict[str, str]:
    """The settings of a `tffleet up` running from this directory, or {} when none is."""
    try:
        text = (data_dir / FLEET_ENV).read_text()
    except OSError:
        return {}
    values = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    try:
        os.kill(int(values.pop("TFFLEET_UP_PID", "")), 0)
    except (ValueError, ProcessLookupError):
        return {}  # left behind by one that was killed
    except PermissionError:
        pass  # alive, another user's
    return values


def fleet_setting(name: str) -> str | None:
    """`name` from the environment, else from the fleet `tffleet up` runs here, else None."""
    return os.environ.get(name) or running_fleet_env().get(name)
