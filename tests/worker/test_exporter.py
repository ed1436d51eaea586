"""The worker's metrics server: a second worker on one host serves on the next free port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import httpx
import pytest

from tffleet.settings import Settings
from worker import exporter


@pytest.fixture(autouse=True)
def multiprocess_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What `tffleet worker` sets up before its children start (`prepare_multiprocess_dir`).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))


@pytest.fixture
def servers() -> Iterator[list[WSGIServer]]:
    started: list[WSGIServer] = []
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


def listening(port: int) -> socket.socket:
    """A socket that holds `port` on every address, as another worker's server would."""
    sock = socket.socket()
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen()
    except OSError:
        sock.close()  # taken: not left for the garbage collector to warn about
        raise
    return sock


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports that are free now."""
    for _ in range(100):
        with ExitStack() as stack:
            first = stack.enter_context(listening(0)).getsockname()[1]
            try:
                for offset in range(1, count):
                    stack.enter_context(listening(first + offset))
            except OSError:
                continue
            return int(first)
    raise AssertionError(f"no {count} consecutive free ports")


def scrape(port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_serves_on_the_port_it_is_given(servers: list[WSGIServer]) -> None:
    port = free_ports(1)

    server = exporter.serve(port)

    assert server is not None
    servers.append(server)
    assert server.server_port == port
    assert scrape(port).status_code == 200


def test_a_taken_port_moves_it_to_the_next_free_one(servers: list[WSGIServer]) -> None:
    port = free_ports(2)
    with listening(port):  # the first worker on this host
        server = exporter.serve(port)

        assert server is not None
        servers.append(server)
        assert server.server_port == port + 1
        assert scrape(port + 1).status_code == 200


def test_two_workers_on_one_host_each_serve(servers: list[WSGIServer]) -> None:
    port = free_ports(2)

    first = exporter.serve(port)
    assert first is not None
    servers.append(first)
    second = exporter.serve(port)
    assert second is not None
    servers.append(second)

    assert (first.server_port, second.server_port) == (port, port + 1)
    assert scrape(port).status_code == scrape(port + 1).status_code == 200


def test_with_every_port_taken_it_serves_nothing() -> None:
    port = free_ports(2)
    with listening(port), listening(port + 1):
        assert exporter.serve(port, tries=2) is None


def test_port_zero_serves_nothing() -> None:
    assert exporter.serve(0) is None


def test_it_listens_on_loopback_unless_opened(servers: list[WSGIServer]) -> None:
    # No key guards them: other hosts reach them only where TFFLEET_WORKER_METRICS_ADDRESS says.
    assert Settings.model_fields["worker_metrics_address"].default == "127.0.0.1"
    port = free_ports(2)

    local = exporter.serve(port)
    assert local is not None
    servers.append(local)
    opened = exporter.serve(port + 1, address="0.0.0.0")
    assert opened is not None
    servers.append(opened)

    assert local.server_address[:2] == ("127.0.0.1", port)
    assert opened.server_address[:2] == ("0.0.0.0", port + 1)
    assert scrape(port).status_code == scrape(port + 1).status_code == 200
