"""The API's HTTP protocol: uvicorn's httptools protocol, less two copies of every body byte, and
a way to read a body straight into the application's own memory.

uvicorn gathers each piece of a body that the parser hands it into a bytearray (`body +=
chunk`), then gives the application `bytes(body)`: two copies of every byte, on top of the two
that uvloop's read and httptools' callback make. Here a piece that arrives while none is waiting
to be read (the usual case: uvicorn stops reading past HIGH_WATER_LIMIT until the application
takes it) is kept as the bytes object the parser made and handed on as it is (`bytes()` of a
bytes object is that object); pieces that pile up are gathered as uvicorn gathers them.

A request with a Content-Length over HIGH_WATER_LIMIT (over plain HTTP; a smaller body comes in
a piece or two, and the small requests of the hot path build nothing more) also carries a
`BodyReader` in its scope's extensions (`READER`): `await reader.readinto(buffer)` fills the
application's buffer from the body, the pieces the parser had already handed on first, then the
rest read from the socket by the kernel straight into the buffer (`_Sink`, an
`asyncio.BufferedProtocol` that stands in for this protocol until the body's last byte). No copy
on our side, and a read per buffer, not a piece of 256 KB each with its Python: a 12.6 MB `.npy`
into a directory store's aligned buffers (tffleet/objectstore/files.py) cost the event loop 4.3
to 5.5 ms this way against 5.5 to 8 (a bare application on uvicorn, 40 bodies, three runs each).
Once the body is whole, this protocol reads the connection again with a new parser, for the next
request. An application that answers before reading the body to its end has its connection
closed after the answer.

`tffleet api` serves with it (tffleet/cli/services.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import httptools
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

READER = "tffleet.body_reader"  # the scope's extension: a `BodyReader`
# What the sink keeps of bytes that arrive while no buffer waits for them (something resumed
# reading between two `readinto`s) before it stops reading.
_SPILL_MAX = 256 * 1024


class LeanBodyProtocol(HttpToolsProtocol):
    _seen = 0  # bytes of the current body the parser has handed on
    _sink: _Sink | None = None  # reading the current body in place of this protocol

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._seen = 0
        length = _content_length(self.headers)
        if length is None or length <= HIGH_WATER_LIMIT:
            return  # none, or one that comes in a piece or two: nothing to read into a buffer
        upgrade = self.parser.should_upgrade()  # no cycle of its own: not this one's to read
        if self.scheme == "http" and self.cycle is not None and not upgrade:
            scope = cast(dict[str, Any], self.scope)
            scope.setdefault("extensions", {})[READER] = BodyReader(self, self.cycle, length)

    def on_body(self, body: bytes) -> None:
        self._seen += len(body)
        cycle = self.cycle
        if cycle.body or cycle.response_complete or self.parser.should_upgrade():
            super().on_body(body)  # pieces piling up, or what uvicorn does with none
            return
        cycle.body = body  # type: ignore[assignment]  # read as bytes(...): no copy
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_response_complete(self) -> None:
        if self._sink is not None:  # answered before its body was read whole
            self.cycle.keep_alive = False
            self.transport.close()
            return
        super().on_response_complete()


class BodyReader:
    """The current request's body read into buffers of the application's (see the module
    docstring). `readinto` and `receive()` are not to be mixed once `readinto` has read."""

    def __init__(self, protocol: LeanBodyProtocol, cycle: RequestResponseCycle, length: int):
        self._protocol = protocol
        self._cycle = cycle
        self.length = length

    def usable(self) -> bool:
        """Whether the body is this connection's current one (not a pipelined request's,
        waiting its turn) and the connection is open."""
        protocol = self._protocol
        return protocol.cycle is self._cycle and not protocol.transport.is_closing()

    async def readinto(self, buffer: memoryview) -> int:
        """Fill `buffer` with the body's next bytes; how many (0: the body has ended). Raises
        starlette's ClientDisconnect where the client went away."""
        protocol, cycle = self._protocol, self._cycle
        if not buffer:
            return 0
        if cycle.waiting_for_100_continue and not protocol.transport.is_closing():
            protocol.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if cycle.body:  # what the parser handed on and the application did not take yet
            taken = min(len(buffer), len(cycle.body))
            buffer[:taken] = memoryview(cycle.body)[:taken]
            cycle.body = cycle.body[taken:]
            return taken
        if cycle.disconnected:
            raise ClientDisconnect()
        sink = protocol._sink
        if sink is None:
            if not cycle.more_body or protocol._seen >= self.length:
                return 0
            sink = protocol._sink = _Sink(protocol, self.length - protocol._seen)
            protocol.transport.pause_reading()
            protocol.transport.set_protocol(sink)
        got = await sink.read(buffer)
        if sink.remaining == 0 and not sink.spilled:
            sink.hand_back()
        return got


class _Sink(asyncio.BufferedProtocol):
    """The transport's protocol while a body is read into the application's buffer: the kernel
    copies each read straight into it, never past the body's end. Reading stops as soon as the
    buffer is full or the body read; bytes that arrive while no buffer waits (something resumed
    reading between two `read`s) are kept, up to _SPILL_MAX, and handed out first."""

    def __init__(self, owner: LeanBodyProtocol, remaining: int) -> None:
        self._owner = owner
        self._transport = owner.transport
        self.remaining = remaining  # bytes of the body not yet read from the socket
        self.spilled = bytearray()  # the body's, read while no buffer waited
        self._after = bytearray()  # past the body: the next request's, for its parser
        self._buffer: memoryview | None = None
        self._got = 0
        self._done: asyncio.Future[int] | None = None
        self._spare = bytearray()
        self._lost = False

    async def read(self, buffer: memoryview) -> int:
        if self.spilled:
            taken = min(len(buffer), len(self.spilled))
            buffer[:taken] = self.spilled[:taken]
            del self.spilled[:taken]
            return taken
        if self.remaining == 0:
            return 0
        if self._lost:
            raise ClientDisconnect()
        self._buffer, self._got = buffer[: self.remaining], 0
        self._done = done = asyncio.get_running_loop().create_future()
        self._transport.resume_reading()
        try:
            return await done
        finally:
            # Filled, failed or cancelled: the buffer is the caller's again, not the socket's.
            self._buffer = None
            if not self._lost:
                self._transport.pause_reading()

    def hand_back(self) -> None:
        """The body is read: the connection goes back to its HTTP protocol, with a new parser
        (the old one still waits for the body's bytes), reading paused as uvicorn's flow
        control knows it, until the answer is sent."""
        owner = self._owner
        owner._sink = None
        self._transport.set_protocol(owner)
        owner.parser = httptools.HttpRequestParser(owner)
        with contextlib.suppress(AttributeError):  # as uvicorn sets its own (httptools 0.6.3+)
            owner.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        owner.flow.read_paused = False
        owner.flow.pause_reading()
        owner.on_message_complete()
        if self._after:
            owner.data_received(bytes(self._after))

    # asyncio.BufferedProtocol

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._buffer is not None:
            return self._buffer[self._got :]
        self._spare = bytearray(max(sizehint, 1))  # no buffer waits: kept (buffer_updated)
        return memoryview(self._spare)

    def buffer_updated(self, nbytes: int) -> None:
        if self._buffer is None:
            self._keep(nbytes)
            return
        self._got += nbytes
        self.remaining -= nbytes
        if self._got == len(self._buffer):  # full, or the body's end (it was cut to it)
            self._buffer = None
            self._transport.pause_reading()
            assert self._done is not None
            self._done.set_result(self._got)

    def _keep(self, nbytes: int) -> None:
        data = memoryview(self._spare)[:nbytes]
        body = min(nbytes, self.remaining)
        self.spilled += data[:body]
        self._after += data[body:]
        self.remaining -= body
        if len(self.spilled) >= _SPILL_MAX or self.remaining == 0:
            self._transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._done is not None and not self._done.done():
            self._done.set_exception(ClientDisconnect())
        self._owner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost follows

    def pause_writing(self) -> None:
        self._owner.pause_writing()

    def resume_writing(self) -> None:
        self._owner.resume_writing()


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's Content-Length, where it has one and no Transfer-Encoding."""
    length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length" and value.isdigit():
            length = int(value)
    return length
