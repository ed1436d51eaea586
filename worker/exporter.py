"""Serving the worker children's metrics from the main process.

The children of one worker share their metrics through prometheus_client's multiprocess mode:
the main process points `PROMETHEUS_MULTIPROC_DIR` at a fresh directory before any child starts
(and before prometheus_client is imported, which reads it then) and serves the merged values.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)

# How many ports from TFFLEET_WORKER_METRICS_PORT up a worker tries: one per worker on a host.
PORT_TRIES = 32


def prepare_multiprocess_dir() -> str:
    """In the main process, before any child starts and before prometheus_client is imported."""
    path = tempfile.mkdtemp(prefix="tffleet-metrics-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def serve(port: int, *, address: str = "127.0.0.1", tries: int = PORT_TRIES) -> WSGIServer | None:
    """Serve the children's merged metrics from the main process (0: do not serve) on `address`
    (TFFLEET_WORKER_METRICS_ADDRESS: loopback unless opened, as they take no key).

    Another worker on this host may hold `port` already: then the next free one above it, up
    to `tries` ports in all. Returns the server (its `server_port`), or None if none was free.
    """
    if not port:
        return None
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    last = min(port + tries, 65536) - 1
    for candidate in range(port, last + 1):
        try:
            server, _thread = start_http_server(candidate, addr=address, registry=registry)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                log.warning("worker metrics not served on port %d: %s", candidate, exc)
                return None
            continue
        if candidate != port:
            log.info("worker metrics: port %d is taken (another worker?)", port)
        host = f"[{address}]" if ":" in address else address
        log.info("worker metrics on http://%s:%d/metrics", host, candidate)
        return server
    log.warning("worker metrics not served: ports %d to %d are all taken", port, last)
    return None
