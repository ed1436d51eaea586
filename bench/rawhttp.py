"""A lean HTTP/1.1 client for load tests: asyncio streams, keep-alive, pre-encoded requests.

It shares two cores with the server under test, so it does as little as it can: no header
objects, no redirects, no compression, just `Content-Length` bodies (which is all uvicorn sends).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class Response:
    status: int
    body: bytes


class Connection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        api_key: str | None = None,
    ):
        self._reader = reader
        self._writer = writer
        self._host = host.encode()
        # Every request's headers after Host, encoded once.
        self._headers = f"\r\nAuthorization: Bearer {api_key}".encode() if api_key else b""

    @classmethod
    async def open(cls, host: str, port: int, *, api_key: str | None = None) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, f"{host}:{port}", api_key)

    def post_bytes(
        self,
        path: str,
        body: bytes,
        *,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> bytes:
        """A whole POST request, encoded once and sent many times."""
        extra = "".join(f"\r\n{name}: {value}" for name, value in (headers or {}).items())
        return (
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + self._host + self._headers
            + extra.encode() + b"\r\nContent-Type: " + content_type.encode()
            + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )  # fmt: skip

    async def request(self, raw: bytes) -> Response:
        self._writer.write(raw)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        body = await self._reader.readexactly(length)
        return Response(status, body)

    async def post(self, path: str, body: bytes) -> Response:
        return await self.request(self.post_bytes(path, body))

    async def get(self, path: str) -> Response:
        return await self.request(
            b"GET "
            + path.encode()
            + b" HTTP/1.1\r\nHost: "
            + self._host
            + self._headers
            + b"\r\n\r\n"
        )

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()
