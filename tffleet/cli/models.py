"""`tffleet models register | list | reload | unregister`: the fleet's models, from the database
and Redis.

Exit status: 0 done; 1 the database failed, or no worker heard a reload; 2 a bad path or model,
or a model that cannot be unregistered yet (a live worker holds it, or jobs of it are unfinished).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from tffleet.cli.database import DatabaseError, fail, print_table, sessions

# As the repository and the API spell them (worker/repository.py, api/schemas.py).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_MAX_VERSION = 2**31 - 1


class ModelUsageError(Exception):
    """A path or option that names no model: `tffleet: ...`, exit status 2."""


def add_model_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = sub.add_parser(
        "models", help="register, list and reload the fleet's models (database and Redis)"
    )
    commands = models.add_subparsers(dest="models_command", required=True, metavar="COMMAND")

    register = commands.add_parser(
        "register",
        help="record a model version's signature without a running worker",
        description="Load the model in PATH (a version directory, MODELS/NAME/VERSION, with "
        "NAME's model.toml beside it) and record its signature, format and config in the "
        "database, so the API validates and queues submissions before any worker serves it.",
    )
    register.add_argument("path", metavar="PATH", help="a version directory: MODELS/NAME/VERSION")
    register.add_argument("--name", help="the model's name (default: PATH's parent directory)")
    register.add_argument(
        "--version", type=int, metavar="N", help="its version (default: PATH's directory name)"
    )
    register.set_defaults(func=cmd_register)

    listing = commands.add_parser(
        "list", help="every registered version, the live workers holding it, its queued jobs"
    )
    listing.set_defaults(func=cmd_list)

    reload = commands.add_parser(
        "reload", help="make every worker rescan the model repository now (new versions load)"
    )
    reload.set_defaults(func=cmd_reload)

    unregister = commands.add_parser(
        "unregister",
        help="take a model (or one version) off the fleet's list once no worker serves it",
        description="Delete NAME's registered versions (or --version N) from the database: the "
        "API then refuses its jobs, and `tffleet models list`, GET /v1/models and the console "
        "no longer show it; its ended jobs stay readable. Refused while a live worker child "
        "holds it (remove NAME from the model repository on every worker host and run "
        "`tffleet models reload` first), and while jobs of it are queued or running, unless "
        "--cancel.",
    )
    unregister.add_argument("name", metavar="NAME", help="the model's name")
    unregister.add_argument(
        "--version", type=int, metavar="N", help="only this version (default: every version)"
    )
    unregister.add_argument(
        "--cancel",
        action="store_true",
        help="cancel its queued and running jobs (in the same transaction) instead of refusing",
    )
    unregister.set_defaults(func=cmd_unregister)


def _identify(args: argparse.Namespace) -> tuple[Path, str, int]:
    path = Path(args.path)
    if not path.is_dir():
        raise ModelUsageError(
            f"{path} is not a directory; PATH is a model version directory, MODELS/NAME/VERSION"
        )
    name = args.name or path.resolve().parent.name
    if not _NAME.fullmatch(name):
        raise ModelUsageError(f"{name!r} is not a model name (letters, digits, _ . -; pass --name)")
    version = args.version
    if version is None:
        if not re.fullmatch(r"[1-9][0-9]{0,8}", path.name):
            raise ModelUsageError(
                f"{path}: the directory name {path.name!r} is not a version number; PATH is "
                f"MODELS/NAME/VERSION (or pass --version)"
            )
        version = int(path.name)
    if not 1 <= version <= _MAX_VERSION:
        raise ModelUsageError(f"--version must be between 1 and {_MAX_VERSION}, got {version}")
    return path, name, version


def cmd_register(args: argparse.Namespace) -> int:
    from db import registry
    from tffleet.settings import get_settings
    from worker.repository import ModelConfig, ModelSpec, detect_format, read_config

    try:
        path, name, version = _identify(args)
        settings = get_settings()
        defaults = ModelConfig(
            max_batch_size=settings.max_batch_size,
            max_queue_delay_ms=settings.max_queue_delay_ms,
            timeout_s=settings.job_timeout_s,
        )
        try:
            config = read_config(path.resolve().parent, defaults=defaults)
        except (OSError, ValueError) as exc:
            raise ModelUsageError(str(exc)) from None
        fmt = config.format or detect_format(path)
        if fmt is None:
            raise ModelUsageError(
                f"{path}: no model in it (a SavedModel's saved_model.pb, one .keras file, or a "
                f"frozen graph's model.pb)"
            )
        _without_gpus_skip_the_cuda_probe()
        from worker import runtime  # TensorFlow: this process is not a Celery worker

        spec = ModelSpec(name, version, path.resolve(), fmt, config)
        try:
            runner = runtime.load(spec)
        except Exception as exc:
            raise ModelUsageError(f"{path}: cannot load it: {type(exc).__name__}: {exc}") from None
    except ModelUsageError as exc:
        print(f"tffleet: {exc}", file=sys.stderr)
        return 2
    try:
        with sessions() as made, made.begin() as session:
            registry.register(
                session=session,
                name=name,
                version=version,
                format=runner.format,
                inputs=runner.inputs,
                outputs=runner.outputs,
                config=config.as_dict(),
            )
    except DatabaseError as exc:
        return fail(str(exc))
    finally:
        close = getattr(runner, "close", None)
        if close is not None:
            close()
    print(
        f"tffleet: registered {name}:{version} ({runner.format}); inputs "
        f"{_signature(runner.inputs)}, outputs {_signature(runner.outputs)}"
    )
    return 0


def _without_gpus_skip_the_cuda_probe() -> None:
    """On a host without GPUs, keep TensorFlow from probing CUDA (and logging the failed probe
    as an error) when it loads the model: set before it is first imported."""
    from tffleet.devices import CPU_ONLY_ENVIRONMENT, count_host_gpus

    if "tensorflow" in sys.modules or count_host_gpus():
        return
    for name, value in CPU_ONLY_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def _signature(tensors: dict[str, dict[str, Any]]) -> str:
    def shape(spec: dict[str, Any]) -> str:
        dims = spec.get("shape")
        return "?" if dims is None else ",".join("?" if d == -1 else str(d) for d in dims)

    return ", ".join(f"{n} {s['dtype']}[{shape(s)}]" for n, s in tensors.items()) or "none"


def cmd_list(args: argparse.Namespace) -> int:
    from db import clock, presence, registry
    from tffleet.settings import get_settings

    settings = get_settings()
    try:
        with sessions() as made, made() as session:
            live_since = presence.live_since(settings.model_poll_s, clock.now(session))
            found = registry.overview(session=session, live_since=live_since)
    except DatabaseError as exc:
        return fail(str(exc))
    rows = [("MODEL", "VERSION", "FORMAT", "STATUS", "QUEUED", "RUNNING", "WORKERS")]
    for v in found.versions:
        status = "retired" if v.retired else "serving" if v.served else "no live worker"
        if v.latest:
            status += ", latest"
        workers = ", ".join(f"{h.host} {h.device} {h.state}" for h in v.holders) or "-"
        rows.append(
            (v.model.name, str(v.model.version), v.model.format, status, str(v.queued),
             str(v.running), workers)
        )  # fmt: skip
    print_table(rows)
    if found.load_errors:
        print("\nLoad errors:")
        for e in found.load_errors:
            what = f"{e.name}:{e.version}" if e.version else f"{e.name} (model.toml)"
            print(f"  {what} on {e.host} {e.device} ({e.path}): {e.error}")
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    from tffleet.constants import MODELS_RELOAD_CHANNEL
    from tffleet.redis_urls import redis_client
    from tffleet.settings import get_settings

    settings = get_settings()
    with redis_client(settings.broker_url, socket_connect_timeout=5) as client:
        heard = int(client.publish(MODELS_RELOAD_CHANNEL, b"{}"))
    if not heard:
        print("tffleet: no worker child is listening; nothing was reloaded", file=sys.stderr)
        return 1
    print(f"tffleet: {heard} worker children are rescanning the model repository")
    return 0


def cmd_unregister(args: argparse.Namespace) -> int:
    from db import clock, presence, registry
    from tffleet.errors import Conflict, ModelNotFound
    from tffleet.settings import get_settings

    settings = get_settings()
    try:
        with sessions() as made, made.begin() as session:
            done = registry.unregister(
                session=session,
                name=args.name,
                version=args.version,
                cancel=args.cancel,
                live_since=presence.live_since(settings.model_poll_s, clock.now(session)),
            )
    except (ModelNotFound, Conflict) as exc:
        print(f"tffleet: {exc}", file=sys.stderr)
        return 2
    except DatabaseError as exc:
        return fail(str(exc))
    gone = ", ".join(f"{done.name}:{v}" for v in done.versions)
    canceled = f" ({registry.jobs_phrase(done.canceled)} canceled)" if done.canceled else ""
    print(f"tffleet: unregistered {gone}{canceled}")
    return 0
