"""The API's HTTP protocol (api/httpserver.py): bodies reach the application whole and in order,
however their pieces arrive, through a real uvicorn server; read through the pieces uvicorn hands
on, or into the application's own buffers (`BodyReader`), the connection then serving its next
requests as before."""

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
from starlette.requests import ClientDisconnect

from api.httpserver import READER, LeanBodyProtocol
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


READ_INTO = 1024 * 1024 + 13  # the reader app's buffer: no multiple of anything
disconnected: list[int] = []  # bytes the reader app had read when its client went away


async def reader_app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def, type-arg]
    """Takes the first piece as `receive()` gives it, then reads the rest into a buffer of its
    own (the path `?half` stops halfway and answers); answers the sha256 of the body, and
    whether it was offered a reader."""
    if scope["type"] != "http":
        return
    reader = scope.get("extensions", {}).get(READER)
    first = await receive()
    digest, read = hashlib.sha256(first.get("body", b"")), len(first.get("body", b""))
    buffer = memoryview(bytearray(READ_INTO))
    more = first.get("more_body", False)
    try:
        while more and reader is not None:
            if scope["query_string"] == b"half" and read >= reader.length // 2:
                break
            got = await reader.readinto(buffer)
            digest.update(buffer[:got])
            read += got
            more = got > 0
        while more and reader is None:
            message = await receive()
            digest.update(message.get("body", b""))
            more = message.get("more_body", False)
    except ClientDisconnect:
        disconnected.append(read)
        return
    answer = f"{digest.hexdigest()} {reader is not None}".encode()
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def serve(app) -> Iterator[int]:  # type: ignore[no-untyped-def]
    port = free_port()
    config = uvicorn.Config(
        app, port=port, http=LeanBodyProtocol, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port, timeout_s=30)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    yield from serve(digest_app)


@pytest.fixture(scope="module")
def reader_port() -> Iterator[int]:
    yield from serve(reader_app)


def post(port: int, head: bytes, pieces: list[bytes], pause_s: float = 0.0) -> str:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        return send(conn, head, pieces, pause_s)


def send(conn: socket.socket, head: bytes, pieces: list[bytes], pause_s: float = 0.0) -> str:
    """One request on the connection; its answer's body (one answer at a time)."""
    conn.sendall(head)
    for piece in pieces:
        conn.sendall(piece)
        if pause_s:
            time.sleep(pause_s)
    return answer_of(conn)


def answer_of(conn: socket.socket) -> str:
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(65536)
    head, body = answer.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        body += conn.recv(65536)
    return body.decode()


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


# ─── A body read into the application's own buffer (BodyReader) ────────────────────────────────


def request(body: bytes, path: str = "/", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n" % (
        path.encode(),
        extra,
        len(body),
    )


@pytest.mark.parametrize("pause_s", [0.0, 0.002])
def test_a_body_read_into_a_buffer_arrives_whole_however_it_is_cut(
    reader_port: int, pause_s: float
) -> None:
    body = os.urandom(3 * READ_INTO + 17)
    cuts = [0, 1, 100, 70_000, 70_001, READ_INTO, 2 * READ_INTO + 5, len(body)]
    pieces = [body[a:b] for a, b in itertools.pairwise(cuts)]
    assert post(reader_port, request(body), pieces, pause_s).split() == [
        hashlib.sha256(body).hexdigest(),
        "True",
    ]


def test_the_connection_serves_requests_after_a_body_read_into_a_buffer(reader_port: int) -> None:
    bodies = [os.urandom(2 * READ_INTO), os.urandom(5), os.urandom(READ_INTO + 1), b""]
    with socket.create_connection(("127.0.0.1", reader_port)) as conn:
        for body in bodies:  # one after the other on one connection: a new parser each time
            digest, _ = send(conn, request(body), [body]).split()
            assert digest == hashlib.sha256(body).hexdigest()
        # Pipelined: the next request's bytes right behind the body, in one write.
        first, second = os.urandom(READ_INTO + 99), os.urandom(1000)
        conn.sendall(request(first) + first + request(second) + second)
        answers = b""
        while answers.count(b"HTTP/1.1 200") < 2 or not answers.endswith((b"True", b"False")):
            answers += conn.recv(65536)
    digests = [
        part.split(b"\r\n\r\n", 1)[1].split()[0].decode()
        for part in answers.split(b"HTTP/1.1 ")[1:]
    ]
    assert digests == [hashlib.sha256(first).hexdigest(), hashlib.sha256(second).hexdigest()]


def test_a_chunked_body_is_offered_no_reader(reader_port: int) -> None:
    body = os.urandom(300_000)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert post(reader_port, head, [chunked]).split() == [hashlib.sha256(body).hexdigest(), "False"]


def test_a_client_waiting_for_100_continue_gets_it(reader_port: int) -> None:
    body = os.urandom(2 * READ_INTO)
    with socket.create_connection(("127.0.0.1", reader_port)) as conn:
        conn.sendall(request(body, extra=b"Expect: 100-continue\r\n"))
        assert conn.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.sendall(body)
        assert answer_of(conn).split()[0] == hashlib.sha256(body).hexdigest()


def test_an_answer_before_the_body_is_read_closes_the_connection(reader_port: int) -> None:
    body = os.urandom(4 * READ_INTO)
    with socket.create_connection(("127.0.0.1", reader_port)) as conn:
        conn.sendall(request(body, "/?half"))
        conn.sendall(body[: 3 * READ_INTO])  # more than the app reads, less than the body
        assert answer_of(conn)
        conn.settimeout(10)
        assert_closed(conn)
    body = os.urandom(10)  # the server serves on
    assert post(reader_port, request(body), [body]).split()[0] == hashlib.sha256(body).hexdigest()


def assert_closed(conn: socket.socket) -> None:
    """The server closes the connection: reads come to their end (or a reset)."""
    try:
        while conn.recv(65536):
            pass
    except ConnectionResetError:
        pass


def test_a_client_that_goes_away_mid_body_is_a_client_disconnect(reader_port: int) -> None:
    body = os.urandom(4 * READ_INTO)
    before = len(disconnected)
    with socket.create_connection(("127.0.0.1", reader_port)) as conn:
        conn.sendall(request(body))
        conn.sendall(body[: 2 * READ_INTO + 7])
        time.sleep(0.2)  # the app reading into its buffer, waiting for more
    deadline = time.monotonic() + 10
    while len(disconnected) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(disconnected) == before + 1
    assert 0 < disconnected[-1] <= 2 * READ_INTO + 7
    body = os.urandom(10)
    assert post(reader_port, request(body), [body]).split()[0] == hashlib.sha256(body).hexdigest()
