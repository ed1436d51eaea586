"""`Client.events` and `AsyncClient.events`: a job's event stream as an iterator of jobs, opened
again with `Last-Event-ID` where it drops. A scripted server on httpx.MockTransport, then the
async client against the app in-process and the blocking one against `tffleet api`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.client.fleet import NO_WAIT, FakeWorker, Served, samples
from tests.client.test_against_api import InProcess, api  # noqa: F401  (a fixture)
from tests.client.test_client import Recorder, error_response, wire_job
from tffleet import Client, NotFound, ServiceUnavailable, TransportError
from tffleet.client import events
from tffleet.client.events import EventDecoder

Y = {"y": {"b64": "AACAPw==", "dtype": "float32", "shape": [1]}}


def event(job: dict[str, Any]) -> bytes:
    job_id = f"{job['status']}.{job['attempts']}"
    return f"event: status\nid: {job_id}\ndata: {orjson.dumps(job).decode()}\n\n".encode()


QUEUED = wire_job(status="queued")
RUNNING = wire_job(status="running", started_at="2026-11-21T06:12:01.9Z")
DONE = wire_job(status="succeeded", started_at="2026-11-21T06:12:01.9Z", outputs=Y)


def stream(*chunks: bytes, error: Exception | None = None) -> httpx.Response:
    """A 200 event stream of `chunks`, broken by `error` after them if given."""

    def body() -> Iterator[bytes]:
        yield b"retry: 2000\n\n"
        yield from chunks
        if error is not None:
            raise error

    return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=body())


def test_events_yields_the_job_at_each_change_until_it_ends() -> None:
    chunks = (event(QUEUED), b": keep-alive\n\n", event(RUNNING), event(DONE))
    recorder = Recorder(lambda _: stream(*chunks))
    with recorder.client() as client:
        seen = list(client.events("j1"))

    assert [job.status for job in seen] == ["queued", "running", "succeeded"]
    assert seen[-1].outputs is not None and seen[-1].outputs["y"].tolist() == [1.0]
    (request,) = recorder.requests
    assert request.url.path == "/v1/jobs/j1/events"
    assert request.url.params["encoding"] == "b64"
    assert request.headers["accept"] == "text/event-stream"
    assert "last-event-id" not in request.headers


def test_a_dropped_stream_is_opened_again_after_the_last_event_seen() -> None:
    answers = iter(
        [
            stream(event(QUEUED), error=httpx.ReadError("connection reset")),
            httpx.ConnectError("refused"),
            error_response(503, "unavailable", "busy"),
            stream(event(RUNNING)),  # ends short of the end: the server went away
            stream(event(DONE)),
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        found = next(answers)
        if isinstance(found, Exception):
            raise found
        return found

    recorder = Recorder(answer)
    with recorder.client() as client:
        seen = [job.status for job in client.events("j1")]

    assert seen == ["queued", "running", "succeeded"]
    sent = [r.headers.get("last-event-id") for r in recorder.requests]
    assert sent == [None, "queued.0", "queued.0", "queued.0", "running.1"]


def test_a_stream_the_api_closed_after_a_while_is_opened_again_however_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events, "MIN_STREAM_S", 0.0)  # every stream was open long enough
    answers = iter([stream(event(QUEUED)), *(stream() for _ in range(5)), stream(event(DONE))])
    recorder = Recorder(lambda _: next(answers))
    with recorder.client() as client:  # NO_WAIT: 3 retries, fewer than the 6 closes
        seen = [job.status for job in client.events("j1")]

    assert seen == ["queued", "succeeded"]
    assert len(recorder.requests) == 7


def test_a_stream_that_keeps_failing_gives_up_after_the_retries() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    recorder = Recorder(answer)
    with pytest.raises(TransportError):
        list(recorder.client().events("j1"))
    assert len(recorder.requests) == 1 + NO_WAIT.attempts

    refused = Recorder(lambda _: error_response(503, "unavailable", "busy"))
    with pytest.raises(ServiceUnavailable):
        list(refused.client().events("j1"))


def test_an_unknown_job_raises_not_found_and_204_ends_the_iteration() -> None:
    missing = Recorder(lambda _: error_response(404, "job_not_found", "job 'j1' not found"))
    with pytest.raises(NotFound):
        list(missing.client().events("j1"))
    assert len(missing.requests) == 1

    ended = Recorder(lambda _: httpx.Response(204))
    assert list(ended.client().events("j1")) == []


def test_the_decoder_reads_events_as_the_spec_says() -> None:
    decoder = EventDecoder()
    lines = ["data: a", "data:b", ": a comment", "id: 7", "", "event: x", "data", "", "id: 8", ""]
    found = [e for line in lines if (e := decoder.feed(line)) is not None]
    assert [(e.event, e.data, e.id) for e in found] == [("message", "a\nb", "7"), ("x", "", "7")]
    assert decoder.last_event_id == "8"  # an event without data is not dispatched; its id holds


@pytest.mark.anyio
async def test_the_async_client_follows_a_job_of_the_app_to_its_end(
    api: InProcess,  # noqa: F811
) -> None:
    job = await api.client.submit("double", samples(2))
    api.worker.serve("double", delay_s=0.3)

    seen = [j async for j in api.client.events(job.id)]

    assert [j.status for j in seen] == ["queued", "succeeded"]
    assert seen[-1].outputs is not None
    np.testing.assert_array_equal(seen[-1].outputs["y"], samples(2) * 2)
    with pytest.raises(NotFound):
        _ = [j async for j in api.client.events("01890000-0000-7000-8000-000000000000")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.slow
def test_the_blocking_client_follows_a_job_of_a_served_api(
    served: Served, worker: FakeWorker
) -> None:
    with Client(served.url, api_key=served.api_key) as client:
        job = client.submit("double", samples(1))
        worker.serve("double", delay_s=0.5)
        seen = list(client.events(job.id))
    assert [j.status for j in seen] == ["queued", "succeeded"]
    assert seen[-1].outputs is not None
