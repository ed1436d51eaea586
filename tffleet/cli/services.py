"""`tffleet api | worker | sweeper | flower | migrate`: one process of the fleet each.

Options given on the command line override the `TFFLEET_*` environment variables. What each
process runs lives in its own package (`api/`, `worker/`, `db/`); these commands only start it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tffleet.devices import Device


def add_service_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    api = sub.add_parser("api", help="run the HTTP API")
    api.add_argument("--host", help="listen address (default $TFFLEET_API_HOST or 127.0.0.1)")
    api.add_argument("--port", type=int, help="listen port (default $TFFLEET_API_PORT or 8000)")
    api.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    api.add_argument(
        "--access-log", action="store_true", help="log every request (uvicorn's access log)"
    )
    api.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)"
    )
    api.set_defaults(func=cmd_api)

    worker = sub.add_parser("worker", help="run a Celery worker, one child per device")
    worker.add_argument("--devices", help="cpu:N, all, or GPU indices such as 0,1")
    worker.add_argument(
        "--model-repository",
        help="the models' directory (default $TFFLEET_MODEL_REPOSITORY or models)",
    )
    worker.add_argument(
        "--models",
        help="comma-separated subset of the repository's models (default: every model, also those "
        "copied in later)",
    )
    worker.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)"
    )
    worker.set_defaults(func=cmd_worker)

    sweeper = sub.add_parser(
        "sweeper",
        help="requeue jobs of lost workers, republish lost wake-ups, purge old results, "
        "deliver webhooks",
    )
    sweeper.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    sweeper.add_argument(
        "--metrics-address", default="127.0.0.1", help="the metrics' listen address (default local)"
    )
    sweeper.set_defaults(func=cmd_sweeper)

    migrate = sub.add_parser("migrate", help="create or upgrade the database schema")
    migrate.set_defaults(func=cmd_migrate)

    flower = sub.add_parser("flower", help="run Flower, the Celery monitor")
    flower.add_argument("--address", default="127.0.0.1", help="listen address (default local)")
    flower.add_argument("--port", type=int, default=5555, help="listen port (default 5555)")
    flower.add_argument("--no-auth", action="store_true", help="allow running without a password")
    flower.set_defaults(func=cmd_flower)


def _apply_overrides(**overrides: object) -> None:
    # Settings are read from the environment, once; child processes inherit it.
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"TFFLEET_{name.upper()}"] = str(value)


def cmd_migrate(args: argparse.Namespace) -> int:
    from db.migrate import upgrade
    from tffleet.settings import get_settings

    url = get_settings().database_url
    upgrade(url)
    print(f"tffleet: database at head ({url.split('@')[-1]})")
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from tffleet.redis_urls import refuse_cluster
    from tffleet.settings import get_settings

    _apply_overrides(api_host=args.host, api_port=args.port)
    settings = get_settings()
    refuse_cluster(settings.broker_url)
    metrics_dir = _api_multiprocess_metrics() if args.workers > 1 else None
    try:
        uvicorn.run(
            "api.app:create_app",
            factory=True,
            http="api.httpserver:LeanBodyProtocol",  # uvicorn's httptools, less two body copies
            host=settings.api_host,
            port=settings.api_port,
            workers=args.workers,
            access_log=args.access_log,
            log_level=args.log_level.lower(),
        )
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _api_multiprocess_metrics() -> str:
    """Several API processes: each writes its metrics to files in a fresh directory and
    /metrics serves them merged (api/metrics.py). Set before uvicorn starts the processes,
    which inherit it and read it when they import prometheus_client."""
    path = tempfile.mkdtemp(prefix="tffleet-api-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def cmd_worker(args: argparse.Namespace) -> int:
    _apply_overrides(devices=args.devices, model_repository=args.model_repository)
    from worker import exporter

    exporter.prepare_multiprocess_dir()  # before anything imports prometheus_client
    from tffleet.broker import DEFAULT_QUEUE, queue_for
    from tffleet.devices import parse_devices
    from tffleet.redis_urls import refuse_cluster
    from tffleet.settings import get_settings
    from worker.app import celery_app
    from worker.repository import model_names

    settings = get_settings()
    refuse_cluster(settings.broker_url)  # else its first BRPOP ends it with CROSSSLOT, status 0
    devices = parse_devices(settings.devices)
    names = model_names(settings.model_repository)
    if args.models:
        wanted = [m.strip() for m in args.models.split(",") if m.strip()]
        missing = sorted(set(wanted) - set(names))
        if missing:
            print(
                f"tffleet: --models names {missing}, which are not in "
                f"{settings.model_repository} (it has {names})",
                file=sys.stderr,
            )
            return 2
        names = wanted
    elsewhere = [n for n in names if not _runs_on(settings.model_repository / n, devices)]
    names = [n for n in names if n not in elsewhere]
    if elsewhere:
        print(
            f"tffleet: not serving {elsewhere}: their model.toml `devices` name none of "
            f"{', '.join(map(str, devices))}",
            file=sys.stderr,
        )
        if args.models and not names:
            return 2
    if not names:
        print(f"tffleet: warning: no models in {settings.model_repository}", file=sys.stderr)
    # With --models the children serve exactly those. Without, every model there is, now or
    # later: a child that loads a model copied in after the start has this process consume its
    # queue too (worker/model_set.py).
    if args.models:
        os.environ["TFFLEET_WORKER_MODELS"] = ",".join(names)
    else:
        os.environ.pop("TFFLEET_WORKER_MODELS", None)
    get_settings.cache_clear()
    queues = [queue_for(n) for n in names] or [DEFAULT_QUEUE]
    print(
        f"tffleet: worker with {len(devices)} children on {', '.join(map(str, devices))}; "
        f"models {names}",
        flush=True,
    )
    served = exporter.serve(settings.worker_metrics_port, address=settings.worker_metrics_address)
    if served is not None:
        # The next free port when another worker on this host has the configured one.
        print(f"tffleet: worker metrics on port {served.server_port}", flush=True)
    celery_app.worker_main(
        [
            "worker",
            "--pool=prefork",
            f"--concurrency={len(devices)}",
            f"--queues={','.join(queues)}",
            f"--loglevel={args.log_level}",
            f"--hostname=tffleet-{os.getpid()}@%h",
        ]
    )
    return 0


def _runs_on(model_dir: Path, devices: Sequence[Device]) -> bool:
    """Whether the model.toml `devices` of a model allow one of these (a bad file: the children
    report it)."""
    from worker.repository import ModelConfig, read_config

    try:
        config = read_config(model_dir, defaults=ModelConfig())
    except (OSError, ValueError):
        return True
    return any(config.serves_device(str(device)) for device in devices)


def cmd_flower(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("flower") is None:
        # Celery would only answer "No such command 'flower'".
        print(
            f"tffleet: Flower is not installed in this environment ({sys.prefix}); it comes with "
            f"tffleet, so reinstall tffleet there, or install the `flower` package: "
            f"{sys.executable} -m pip install 'flower>=2.0'",
            file=sys.stderr,
        )
        return 2
    auth = os.environ.get("TFFLEET_FLOWER_BASIC_AUTH")
    argv = [
        sys.executable, "-m", "celery", "-A", "worker.app", "flower",
        f"--address={args.address}", f"--port={args.port}",
    ]  # fmt: skip
    env = dict(os.environ)
    if auth:
        # Through the environment (Flower reads FLOWER_*), never argv: `ps` shows argv to all.
        env["FLOWER_BASIC_AUTH"] = auth
    elif not args.no_auth:
        print(
            "tffleet: Flower can revoke tasks and shut workers down; set "
            "TFFLEET_FLOWER_BASIC_AUTH=user:password (or pass --no-auth on a private network)",
            file=sys.stderr,
        )
        return 2
    os.execve(sys.executable, argv, env)


def cmd_sweeper(args: argparse.Namespace) -> int:
    import signal
    import threading

    from prometheus_client import start_http_server

    from db.engine import make_engine, make_sessionmaker
    from tffleet.broker import PUBLISH_SOCKET_TIMEOUT_S, Publisher, make_celery
    from tffleet.redis_urls import redis_client, refuse_cluster
    from tffleet.settings import get_settings
    from worker.sweeper import Sweeper
    from worker.webhooks import Deliverer

    settings = get_settings()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    refuse_cluster(settings.broker_url)
    client = redis_client(settings.broker_url, socket_timeout=5, socket_connect_timeout=5)
    engine = make_engine(settings.database_url, pool_size=1)
    sweeper = Sweeper(
        make_sessionmaker(engine),
        Publisher(make_celery(settings, socket_timeout_s=PUBLISH_SOCKET_TIMEOUT_S)),
        settings,
        client,
    )
    # Webhooks go out from a thread of their own, on connections of their own: a slow
    # receiver never holds up a sweep (worker/webhooks.py).
    webhook_engine = make_engine(settings.database_url, pool_size=4)
    deliverer = Deliverer(make_sessionmaker(webhook_engine), settings).start(stop)
    print(f"tffleet: sweeper, every {settings.sweep_interval_s:g}s", flush=True)
    try:
        sweeper.run(stop)
    finally:
        stop.set()
        deliverer.join(timeout=10)
        webhook_engine.dispose()
        engine.dispose()
        client.close()
    return 0
