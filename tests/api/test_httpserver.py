"""The API's HTTP protocol (api/httpserver.py): bodies reach the application whole and in order,
however their pieces arrive, through a real uvicorn server."""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from api.httpserver import LeanBodyProtocol
from tffleet.cli.process_group import free_port, wait_for_port


async def digest_app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def, type-arg]
    """Answers the sha256 of the body it read, and how many pieces it came in."""
    if scope["type"] != "http":
        return
    digest, pieces = hashlib.sha256(), 0
    while True:
        message = await receive()
        digest.update(message.get("body", b""))
        pieces += 1
        if not message.get("more_body"):
            break
    answer = f"{digest.hexdigest()} {pieces}".encode()
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        digest_app, port=port, http=LeanBodyProtocol, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port, timeout_s=30)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def post(port: int, head: bytes, pieces: list[bytes], pause_s: float = 0.0) -> str:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head)
        for piece in pieces:
            conn.sendall(piece)
            if pause_s:
                time.sleep(pause_s)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.split(b"\r\n\r\n", 1)[1]:
            answer += conn.recv(65536)
        return answer.split(b"\r\n\r\n", 1)[1].decode()


@pytest.mark.parametrize("pause_s", [0.0, 0.002])
def test_a_large_body_arrives_whole_however_it_is_cut(port: int, pause_s: float) -> None:
    body = os.urandom(3 * 1024 * 1024 + 17)
    cuts = [0, 1, 100, 70_000, 70_001, 1_000_000, 2_500_000, len(body)]
    pieces = [body[a:b] for a, b in itertools.pairwise(cuts)]
    head = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)

    digest, _ = post(port, head, pieces, pause_s).split()

    assert digest == hashlib.sha256(body).hexdigest()


def test_a_chunked_body_and_an_empty_one_arrive_whole(port: int) -> None:
    body = os.urandom(300_000)
    chunked = b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:5], body[5:200_000], body[200_000:])
    )
    head = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    digest, _ = post(port, head, [chunked + b"0\r\n\r\n"]).split()
    assert digest == hashlib.sha256(body).hexdigest()

    empty = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
    digest, pieces = post(port, empty, []).split()
    assert (digest, pieces) == (hashlib.sha256(b"").hexdigest(), "1")
