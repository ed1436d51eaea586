"""Following a job's event stream (`GET /v1/jobs/{id}/events`), without I/O: both clients drive
a `Follow` over an httpx streamed response, as they drive plans over single requests.

The stream is server-sent events (the WHATWG `text/event-stream` format): one `status` event
with the job at each change of its status, ending after the event of an ended status. A
connection that drops (a transport error, a 429 or 503, a stream that stops short of the end)
is opened again with `Last-Event-ID`, so the API sends only what came after; `Retries.attempts`
times in a row at most, with its back-off, the count starting over at each event. The API also
closes the stream of a job that has not ended every 30 s or so: a stream that was open for
`MIN_STREAM_S` or more is opened again at once, and the count starts over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
import orjson

from tffleet.client.errors import ProtocolError
from tffleet.client.job import Job
from tffleet.client.protocol import Call, Retries, error_for
from tffleet.client.protocol import _transport_error as transport_error

EVENT_STREAM = "text/event-stream"
# The API sends a comment at least this often on a quiet stream; a read waits that long more.
KEEP_ALIVE_S = 15.0
_RETRY_STATUSES = frozenset({429, 503})
# A stream that ends this long or more after it opened was closed by the API on purpose.
MIN_STREAM_S = 1.0


@dataclass
class Event:
    """One dispatched event: its type (`message` unless named), data, and the last id seen."""

    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class EventDecoder:
    """Lines of a `text/event-stream` (without their line ends) to events, as the spec says:
    fields `event`, `data` (lines joined with \\n), `id` (kept across events), comments ignored,
    an event dispatched at a blank line unless it has no data."""

    last_event_id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Event | None:
        if not line:
            event, data, self._event, self._data = self._event, self._data, "", []
            if not data:
                return None
            return Event(event or "message", "\n".join(data), self.last_event_id)
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
        return None  # `retry` and unknown fields: the client's own back-off decides


class Follow:
    """One `events()` iteration: what to ask for next, and what each answer and line means."""

    def __init__(self, job_id: str, *, encoding: str, retries: Retries) -> None:
        self._path = f"/v1/jobs/{quote(job_id, safe='')}/events"
        self._encoding = encoding
        self._retries = retries
        self._decoder = EventDecoder()
        self._failures = 0
        self._refused: Exception | None = None  # a 429 or 503 answer, tried again
        self._opened_at: float | None = None  # when the stream now read opened
        self.ended = False

    def call(self) -> Call:
        headers = {"Accept": EVENT_STREAM}
        if self._decoder.last_event_id is not None:
            headers["Last-Event-ID"] = self._decoder.last_event_id
        return Call("GET", self._path, params={"encoding": self._encoding}, headers=headers)

    @staticmethod
    def timeout(base: httpx.Timeout) -> httpx.Timeout:
        """A read may wait for the next keep-alive comment."""
        if base.read is None:
            return base
        read = base.read + KEEP_ALIVE_S
        return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)

    def opened(self, response: httpx.Response) -> bool:
        """Whether to read the stream of this answer (its body read already unless 200); False:
        the job had ended (204), or ask again after `dropped(None)` (429, 503)."""
        self._refused, self._opened_at = None, None
        if response.status_code == 200:
            self._opened_at = time.monotonic()
            self._decoder = EventDecoder(self._decoder.last_event_id)  # a new stream
            return True
        if response.status_code == 204:  # the end was seen already
            self.ended = True
            return False
        if response.status_code in _RETRY_STATUSES:
            self._refused = error_for(response)
            return False
        raise error_for(response)

    def line(self, line: str) -> Job | None:
        """The job of a `status` event this line dispatches, if it does."""
        event = self._decoder.feed(line)
        if event is None or event.event != "status":
            return None
        try:
            job = Job.from_wire(orjson.loads(event.data))
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"an event's data is not JSON: {exc}") from None
        self._failures = 0
        self.ended = job.finished
        return job

    def dropped(self, exc: httpx.RequestError | None, call: Call) -> float:
        """The connection broke (`exc`), was refused for now (429, 503), or the stream stopped
        short of the job's end: seconds to wait before the next try, or the error once the tries
        are spent."""
        opened_at, self._opened_at = self._opened_at, None
        if opened_at is not None and time.monotonic() - opened_at >= MIN_STREAM_S:
            # It was open a while: the API is there. Closed by the API (exc None): resume at once.
            self._failures = 0
            if exc is None:
                return 0.0
        if exc is None:
            stopped = ProtocolError(f"the event stream of {self._path} stopped early")
            self._give_up_after(self._refused or stopped)
        elif isinstance(exc, httpx.TransportError):
            self._give_up_after(transport_error(exc, call))
        else:
            raise transport_error(exc, call) from exc
        return self._retries.delay_s(self._failures - 1)

    def _give_up_after(self, error: Exception) -> None:
        if self._failures >= self._retries.attempts:
            raise error
        self._failures += 1
