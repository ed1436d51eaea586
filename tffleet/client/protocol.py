"""The v1 HTTP contract without I/O, shared by `Client` and `AsyncClient`: one request.

Each operation (`tffleet.client.plans`) is a *plan*: a generator that yields what to do next, a
`Call` (one HTTP request) or a `Sleep`, and is sent the `httpx.Response` back (or has the
transport's error thrown in). The two clients only drive plans, one blocking and one with
`await`; every decision (what to send, retries, chunking, long-poll rounds, deadlines, reading
the answers) is made once, here and in `plans`.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import numpy as np
import orjson

from tffleet.client.errors import ConnectError, HTTPStatusError, ProtocolError, TransportError
from tffleet.errors import class_for
from tffleet.fleet_env import DEFAULT_URL, fleet_setting
from tffleet.tensors import NPY, NPZ, TensorError, read_npy, read_npz
from tffleet.version import __version__

T = TypeVar("T")

USER_AGENT = f"tffleet-client/{__version__}"


def connection(
    url: str | httpx.URL | None, api_key: str | None, headers: dict[str, str] | None
) -> tuple[str | httpx.URL, dict[str, str]]:
    """The API's URL and the headers every request carries. Each of URL and key comes from the
    argument, else $TFFLEET_URL / $TFFLEET_API_KEY, else the `tffleet up` running in this
    directory (tffleet.fleet_env); the URL last from http://127.0.0.1:8000."""
    url = url or fleet_setting("TFFLEET_URL") or DEFAULT_URL
    api_key = api_key or fleet_setting("TFFLEET_API_KEY")
    sent = {"User-Agent": USER_AGENT}
    if api_key:
        sent["Authorization"] = f"Bearer {api_key}"
    return url, {**sent, **(headers or {})}


_RETRY_STATUSES = frozenset({429, 503})  # the contract: an error response leaves no job behind
_NOT_CONNECTED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Stream:
    """A body sent in chunks, never joined into one bytes object (an upload of a large array
    straight from its buffer): `chunks()` starts it afresh at each try, `length` is its
    Content-Length."""

    length: int
    chunks: Callable[[], Iterable[bytes | memoryview]]


@dataclass(frozen=True)
class Call:
    """One HTTP request, safe to send again. `wait_s`: how long the server may hold it.
    `stream`: a body sent in chunks instead of `content`."""

    method: str
    path: str
    params: dict[str, str] | None = None
    content: bytes | None = None
    headers: dict[str, str] | None = None
    wait_s: float = 0.0
    stream: Stream | None = None


@dataclass(frozen=True)
class Sleep:
    seconds: float


Op = Call | Sleep
Plan = Generator[Op, Any, T]


@dataclass(frozen=True)
class Retries:
    """When a call is tried again, and how long to back off (doubling, with jitter).

    Every call is retried after a transport error or a 429 or 503 answer (which, by the
    contract, stored nothing). Every call is safe to repeat: reads and cancels by nature, and a
    submit carries an `Idempotency-Key`, so one sent again gets the jobs the first one stored.
    An answer's `Retry-After` (seconds: a key over its rate says when its jobs would pass) is
    waited instead of the back-off, up to `max_retry_after_s`.
    """

    attempts: int = 3  # retries after the first try
    backoff_s: float = 0.2
    max_backoff_s: float = 2.0
    max_retry_after_s: float = 30.0

    def delay_s(self, retry: int, *, retry_after_s: float | None = None) -> float:
        if retry_after_s is not None:
            return min(self.max_retry_after_s, retry_after_s)
        return min(self.max_backoff_s, self.backoff_s * 2**retry) * random.uniform(0.5, 1.0)


def retry_after_s(response: httpx.Response) -> float | None:
    """An answer's `Retry-After` in seconds (the API sends seconds; an HTTP date is not read)."""
    try:
        value = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


# One request, retried and read


def send(call: Call, retries: Retries, *, raw: bool = False) -> Plan[Any]:
    """Send `call` until it is answered; returns the decoded JSON of a 2xx answer (`raw`: its
    bytes as they came, a file streamed by the API)."""
    retry = 0
    while True:
        after: float | None = None
        try:
            response: httpx.Response = yield call
        except httpx.RequestError as exc:
            if not isinstance(exc, httpx.TransportError) or retry >= retries.attempts:
                raise _transport_error(exc, call) from exc
        else:
            if response.status_code not in _RETRY_STATUSES or retry >= retries.attempts:
                if raw and response.status_code < 400:
                    return response.content
                return read(response)
            after = retry_after_s(response)
        yield Sleep(retries.delay_s(retry, retry_after_s=after))
        retry += 1


# Asked for on reads of one job: a job that has succeeded comes back as an .npz of its outputs
# (the job itself in the `Tffleet-Job` header), any other as JSON. A server that does not know
# .npz answers JSON, which is read as ever.
ACCEPT_NPZ = f"{NPZ}, application/json"


def read(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise error_for(response)
    if response.status_code == 204:  # a delete: no content
        return None
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == NPZ:
        return read_npz_job(response)
    if media == NPY:
        return read_npy_answer(response)
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"{response.status_code} answer is not JSON: {exc}") from None


def read_npz_job(response: httpx.Response) -> dict[str, Any]:
    """A job answered as an .npz of its outputs: its JSON from the `Tffleet-Job` header, its
    outputs the caller's own (writable) arrays, each copied once out of the answer."""
    try:
        job = orjson.loads(response.headers["tffleet-job"])
        arrays = read_npz(response.content)
    except (KeyError, orjson.JSONDecodeError, TensorError) as exc:
        raise ProtocolError(f"{response.status_code} .npz answer is not a job's: {exc!r}") from None
    if not isinstance(job, dict):
        raise ProtocolError(f"{response.status_code} .npz answer: Tffleet-Job is not a job")
    job["outputs"] = {name: np.array(array) for name, array in arrays.items()}
    return job


def read_npy_answer(response: httpx.Response) -> np.ndarray:
    """An .npy answer (an output fetched by reference) as the caller's own writable array:
    read as np.load reads it, never unpickling, then copied once out of the answer."""
    try:
        return np.array(read_npy(response.content))
    except TensorError as exc:
        raise ProtocolError(f"{response.status_code} .npy answer: {exc}") from None


def error_for(response: httpx.Response) -> HTTPStatusError:
    try:
        error = orjson.loads(response.content)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):  # a proxy's page, say
        code, message = "http_error", response.text[:200] or response.reason_phrase
    cls = class_for(response.status_code, code)
    return cls.from_answer(response.status_code, code, message, response=response)


def _transport_error(exc: httpx.RequestError, call: Call) -> TransportError:
    try:
        where = str(exc.request.url)
    except RuntimeError:  # raised by a transport that attached no request
        where = call.path
    cls = ConnectError if isinstance(exc, _NOT_CONNECTED) else TransportError
    return cls(f"{call.method} {where}: {type(exc).__name__}: {exc}")


def timeout_for(call: Call, base: httpx.Timeout) -> httpx.Timeout:
    """A long-poll may stay silent for `wait_s` on top of the usual read timeout."""
    if not call.wait_s or base.read is None:
        return base
    return httpx.Timeout(
        connect=base.connect, read=base.read + call.wait_s, write=base.write, pool=base.pool
    )


def build_request(
    http: httpx.Client | httpx.AsyncClient, call: Call, base: httpx.Timeout
) -> httpx.Request:
    headers = {"Content-Type": "application/json"} if call.content is not None else {}
    content: bytes | Iterator[bytes] | AsyncIterator[bytes] | None = call.content
    if call.stream is not None:
        headers["Content-Length"] = str(call.stream.length)
        chunks = iter(call.stream.chunks())
        # httpx sends what an iterator yields as it comes; an AsyncClient wants it async.
        content = _async(chunks) if isinstance(http, httpx.AsyncClient) else chunks  # type: ignore[assignment]
    return http.build_request(
        call.method,
        call.path,
        params=call.params,
        content=content,
        headers={**headers, **(call.headers or {})},
        timeout=timeout_for(call, base),
    )


async def _async(chunks: Iterator[bytes | memoryview]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk  # type: ignore[misc]  # a memoryview: sent as it is, never copied
