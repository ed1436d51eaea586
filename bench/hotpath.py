"""What FastAPI's router costs the two hot requests, against api/hotpath.py's way past it, side by
side in one run (issue 28's API share).

    .venv/bin/python -m bench.hotpath           # about a minute
    .venv/bin/python -m bench.hotpath --quick   # a smoke test

The app runs in this process (its lifespan included; SQLite in a temporary directory, a Redis
of its own, no worker: the jobs stay queued and are deleted after each batch), called through
ASGI directly, without sockets or an HTTP client, so the CPU per request (this process's, every
thread) is the app's own: the route's work and the framework's around it. Each request is sent
both ways in turns, batch by batch: `POST /v1/jobs` of a one-sample JSON job and `GET
/v1/jobs/{id}` of a queued job, past the router (api/hotpath.py) and through it (the same app
with `hotpath.route` answering None for every request, as for any other route).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from api import hotpath
from api.app import create_app
from bench.transport import forget
from db import registry, tenants
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import DEFAULT_TENANT
from tffleet.cli.process_group import ProcessGroup
from tffleet.settings import Settings

BODY = orjson.dumps({"model": "one", "inputs": [[0.5, 1.5, -2.0, 3.25]]})
WAYS = ("past the router", "through the router")
Send = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class Asgi:
    """Requests to an ASGI app, each answer's status and body read back."""

    app: Any
    api_key: str

    async def request(self, method: str, path: str, body: bytes = b"") -> dict[str, Any]:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80), "state": {},
            "headers": [
                (b"host", b"tffleet"), (b"authorization", f"Bearer {self.api_key}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        status = sent[0]["status"]
        answer = b"".join(m.get("body", b"") for m in sent[1:])
        if status >= 300:
            raise RuntimeError(f"{method} {path} answered {status}: {answer[:300]!r}")
        return orjson.loads(answer)  # type: ignore[no-any-return]


def _setup(database_url: str) -> str:
    upgrade(database_url)
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        registry.register(
            session=session, name="one", version=1, format="savedmodel",
            inputs={"x": {"dtype": "float32", "shape": [-1, 4]}},
            outputs={"y": {"dtype": "float32", "shape": [-1, 2]}},
        )  # fmt: skip
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
    engine.dispose()
    return key


async def measure(
    settings: Settings, api_key: str, *, rounds: int, per_batch: int
) -> dict[tuple[str, str], float]:
    app = create_app(settings)
    route = hotpath.route
    cpu_us: dict[tuple[str, str], list[float]] = {}
    async with app.router.lifespan_context(app):
        asgi = Asgi(app, api_key)
        queued = (await asgi.request("POST", "/v1/jobs", BODY))["id"]
        sends: dict[str, Send] = {
            "POST /v1/jobs": lambda: asgi.request("POST", "/v1/jobs", BODY),
            "GET /v1/jobs/{id}": lambda: asgi.request("GET", f"/v1/jobs/{queued}"),
        }
        try:
            for round_ in range(rounds + 1):  # the first round warms every path: not counted
                for name, send in sends.items():
                    for way in WAYS:
                        hotpath.route = route if way == WAYS[0] else (lambda scope: None)
                        ids: list[str] = []
                        started = time.process_time()
                        for _ in range(per_batch):
                            ids.append((await send())["id"])
                        spent = time.process_time() - started
                        if round_:
                            cpu_us.setdefault((name, way), []).append(spent / per_batch * 1e6)
                        if name.startswith("POST"):
                            await asyncio.to_thread(forget, settings.database_url, ids)
        finally:
            hotpath.route = route
    return {key: sorted(values)[len(values) // 2] for key, values in cpu_us.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests: a smoke test")
    args = parser.parse_args(argv)
    rounds, per_batch = (1, 50) if args.quick else (7, 500)
    from bench.run import start_redis

    with tempfile.TemporaryDirectory(prefix="tffleet-bench-hotpath-") as tmp:
        group = ProcessGroup()
        try:
            settings = Settings(
                database_url=f"sqlite:///{tmp}/api.db",
                broker_url=f"redis://127.0.0.1:{start_redis(group, tmp)}/0",
                object_store=Path(tmp, "objects").as_uri(),
            )
            api_key = _setup(settings.database_url)
            cpu = asyncio.run(measure(settings, api_key, rounds=rounds, per_batch=per_batch))
        finally:
            group.stop()
    print(f"\ntffleet API CPU per request, in process, median of {rounds} batches of {per_batch}")
    for name in ("POST /v1/jobs", "GET /v1/jobs/{id}"):
        fast, routed = (cpu[(name, way)] for way in WAYS)
        print(
            f"  {name:<18} {WAYS[0]} {fast:6.0f} us, {WAYS[1]} {routed:6.0f} us:"
            f" {routed - fast:4.0f} us saved, {fast / routed:4.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
