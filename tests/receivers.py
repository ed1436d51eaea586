"""Webhook receivers for the tests: one that answers as scripted and records what it got, and one
that takes connections and never answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered
    at: float = field(default_factory=time.monotonic)

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


class Receiver:
    """Answers each POST with the next status of `script` (then `then` forever); a 3xx carries a
    Location to /elsewhere. With `fail_each`, the first that many attempts of each `webhook-id`
    are answered 503."""

    def __init__(
        self, script: list[int] | None = None, then: int = 200, *, fail_each: int = 0
    ) -> None:
        self.script = list(script or [])
        self.then = then
        self.fail_each = fail_each
        self.received: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._lock:
                    status = receiver.script.pop(0) if receiver.script else receiver.then
                    seen = sum(
                        1
                        for r in receiver.received
                        if r.headers.get("webhook-id") == self.headers.get("webhook-id")
                    )
                    if seen < receiver.fail_each:
                        status = 503
                    receiver.received.append(
                        Received(self.path, dict(self.headers.items()), body, status)
                    )
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def accepted(self) -> list[Received]:
        with self._lock:
            return [r for r in self.received if 200 <= r.status < 300]

    def wait_for(self, count: int, timeout_s: float = 20.0) -> list[Received]:
        """Until `count` deliveries were accepted (2xx); the accepted ones."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.accepted()) >= count:
                return self.accepted()
            time.sleep(0.02)
        raise AssertionError(f"{len(self.accepted())} of {count} deliveries in {timeout_s}s")

    def __enter__(self) -> Receiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def black_hole() -> Iterator[str]:
    """A URL whose port takes connections (the kernel's backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    finally:
        sock.close()
