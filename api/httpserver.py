"""The API's HTTP protocol: uvicorn's httptools protocol, less two copies of every body byte.

uvicorn gathers each piece of a body that the parser hands it into a bytearray (`body +=
chunk`), then gives the application `bytes(body)`: two copies of every byte, on top of the two
that uvloop's read and httptools' callback make. Here a piece that arrives while none is waiting
to be read (the usual case: uvicorn stops reading past HIGH_WATER_LIMIT until the application
takes it) is kept as the bytes object the parser made and handed on as it is (`bytes()` of a
bytes object is that object); pieces that pile up are gathered as uvicorn gathers them.
`tffleet api` serves with it (tffleet/cli/services.py).
"""

from __future__ import annotations

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class LeanBodyProtocol(HttpToolsProtocol):
    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.body or cycle.response_complete or self.parser.should_upgrade():
            super().on_body(body)  # pieces piling up, or what uvicorn does with none
            return
        cycle.body = body  # type: ignore[assignment]  # read as bytes(...): no copy
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()
