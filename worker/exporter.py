"""Serving the worker children's metrics from the main process.

The children of one worker share their metrics through prometheus_client's multiprocess mode:
the main process points `PROMETHEUS_MULTIPROC_DIR` at a fresh directory before any child starts
(and before prometheus_client is imported, which reads it then) and serves the merged values.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile

log = logging.getLogger(__name__)


def prepare_multiprocess_dir() -> str:
    """In the main process, before any child starts and before prometheus_client is imported."""
    path = tempfile.mkdtemp(prefix="tffleet-metrics-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def serve(port: int) -> None:
    """Serve the children's merged metrics from the main process (0: do not serve)."""
    if not port:
        return
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    try:
        start_http_server(port, registry=registry)
    except OSError as exc:
        log.warning("worker metrics not served on port %d: %s", port, exc)
    else:
        log.info("worker metrics on http://0.0.0.0:%d/metrics", port)
