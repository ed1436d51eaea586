"""The client and the object store (DESIGN §13): `upload`, inputs over the inline limit uploaded
by `submit`, `submit_many` and `run`, and outputs given by reference fetched into `Job.outputs`.

First on a scripted transport (what is sent, how answers are read), then against the real API:
the async client in-process, the blocking one over a socket to `tffleet api`, each with a store
of its own. No worker runs: `finish_storing` plays one that reads its inputs from the store and
writes outputs over the limit to it, as the worker does.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis

from api.app import create_app
from db import jobs
from db.engine import make_engine, make_sessionmaker
from db.models import DEFAULT_TENANT
from tests.client.fleet import NO_WAIT, Served, fake_model, register_models, samples
from tffleet import AsyncClient, Client, OutputsGone, ProtocolError, tensors
from tffleet.client.objects import DEFAULT_INLINE_MAX_BYTES
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.objectstore import ObjectStore, keys, open_store
from tffleet.settings import Settings

BIG = np.arange(25_000 * 4, dtype=np.float32).reshape(25_000, 4) / 7  # 400 KB: uploaded
URI = "tffleet://uploads/" + "ab" * 16


def wire_job(job_id: str = "j1", status: str = "queued", **fields: Any) -> dict[str, Any]:
    return {
        "id": job_id, "model": "double", "version": 1, "status": status, "priority": 0,
        "created_at": "2026-11-21T06:12:01Z", "started_at": None, "finished_at": None,
        "attempts": 0, "error": None, "outputs": None, "worker": None, **fields,
    }  # fmt: skip


class Server(httpx.BaseTransport):
    """A transport (not MockTransport, which reads a body before its handler sees it):
    records each request (its body read), answers uploads with `URI`, submits with a queued
    job, and other paths from `routes`."""

    def __init__(
        self, routes: Mapping[str, Callable[[httpx.Request], httpx.Response]] | None = None
    ):
        self.routes = dict(routes or {})
        self.requests: list[httpx.Request] = []
        self.streamed: list[bool] = []  # whether each body came as an iterator, not one bytes

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.streamed.append(not isinstance(request.stream, httpx.ByteStream))
        request.read()
        self.requests.append(request)
        if request.url.path in self.routes:
            return self.routes[request.url.path](request)
        if request.url.path == "/v1/uploads":
            return httpx.Response(201, json={"uri": URI, "upload_url": None})
        if request.url.path == "/v1/jobs":
            body = (
                orjson.loads(request.content)
                if request.headers["content-type"].endswith("json")
                else {}
            )
            if "jobs" in body:
                return httpx.Response(
                    202, json={"jobs": [wire_job(f"j{i}") for i in range(len(body["jobs"]))]}
                )
            return httpx.Response(202, json=wire_job())
        return httpx.Response(404, json={"detail": "Not Found"})

    def paths(self) -> list[tuple[str, str]]:
        return [(r.method, r.url.path) for r in self.requests]

    def client(self, **kwargs: Any) -> Client:
        return Client("http://t", transport=self, retries=NO_WAIT, **kwargs)


def npy_response(array: np.ndarray) -> httpx.Response:
    return httpx.Response(
        200, content=tensors.write_npy(array), headers={"content-type": tensors.NPY}
    )


# Uploads


def test_upload_streams_the_npy_from_the_arrays_buffer_and_returns_its_uri() -> None:
    server = Server()
    with server.client() as client:
        assert client.upload(BIG) == URI

    (request,) = server.requests
    assert request.headers["content-type"] == tensors.NPY
    assert int(request.headers["content-length"]) == len(request.content)
    np.testing.assert_array_equal(np.load(io.BytesIO(request.content), allow_pickle=False), BIG)
    assert server.streamed == [True]  # httpx was handed an iterator, not one body


def test_an_upload_of_any_layout_is_the_array_as_np_load_reads_it() -> None:
    server = Server()
    odd = {
        "fortran": np.asfortranarray(samples(3)),
        "big-endian": samples(2).astype(">f4"),
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "bool": np.array([[True, False]]),
    }
    with server.client() as client:
        for array in odd.values():
            client.upload(array)

    for request, (name, array) in zip(server.requests, odd.items(), strict=True):
        got = np.load(io.BytesIO(request.content), allow_pickle=False)
        np.testing.assert_array_equal(got, array, err_msg=name)
        assert got.shape == array.shape and got.dtype == array.dtype.newbyteorder("<"), name


def test_an_upload_sent_again_after_a_503_sends_the_whole_body_again() -> None:
    answers = iter([httpx.Response(503, json={"error": {"code": "unavailable", "message": "x"}})])

    def upload(request: httpx.Request) -> httpx.Response:
        return next(answers, httpx.Response(201, json={"uri": URI}))

    server = Server({"/v1/uploads": upload})
    with server.client() as client:
        assert client.upload(BIG) == URI

    first, second = server.requests
    assert first.content == second.content == tensors.write_npy(BIG)


def test_a_named_input_over_the_limit_is_uploaded_and_the_job_names_it() -> None:
    server = Server()
    small = samples(1)
    with server.client() as client:
        client.submit("pair", {"a": BIG, "b": small})

    assert server.paths() == [("POST", "/v1/uploads"), ("POST", "/v1/jobs")]
    body = orjson.loads(server.requests[1].content)
    assert body["inputs"]["a"] == {"uri": URI}
    assert body["inputs"]["b"] == tensors.encode(small, encoding="b64")


def test_the_limit_is_the_clients_own_and_none_uploads_nothing() -> None:
    x = samples(1000)  # 16 KB
    server = Server()
    with server.client(inline_max_bytes=8 * 1024) as client:
        client.submit("double", {"x": x})
    assert server.paths()[0] == ("POST", "/v1/uploads")

    server = Server()
    with server.client(inline_max_bytes=None) as client:
        client.submit("double", {"x": BIG})
    assert server.paths() == [("POST", "/v1/jobs")]  # an .npz body, as before uploads
    assert server.requests[0].headers["content-type"] == tensors.NPZ
    assert DEFAULT_INLINE_MAX_BYTES == 256 * 1024  # over the API's 8 KiB: one request


def test_a_bare_array_goes_as_an_npy_body_which_the_api_stores_itself() -> None:
    server = Server()
    with server.client() as client:
        client.submit("double", BIG)

    assert server.paths() == [("POST", "/v1/jobs")]
    assert server.requests[0].headers["content-type"] == tensors.NPY


def test_an_api_without_uploads_gets_the_arrays_inline() -> None:
    def no_route(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    server = Server({"/v1/uploads": no_route})
    with server.client() as client:
        client.submit("double", {"x": BIG})

    assert server.paths() == [("POST", "/v1/uploads"), ("POST", "/v1/jobs")]
    assert server.requests[1].headers["content-type"] == tensors.NPZ


def test_submit_many_uploads_each_jobs_large_inputs_before_its_request() -> None:
    server = Server()
    with server.client() as client:
        jobs = client.submit_many("double", [{"x": BIG}, {"x": samples(1)}, {"x": BIG}])

    assert len(jobs) == 3
    assert server.paths() == [
        ("POST", "/v1/uploads"),
        ("POST", "/v1/uploads"),
        ("POST", "/v1/jobs"),
    ]
    sent = orjson.loads(server.requests[2].content)["jobs"]
    assert [job["inputs"]["x"] == {"uri": URI} for job in sent] == [True, False, True]


def test_a_large_upload_shows_a_progress_bar_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    with Server().client() as client:
        client.upload(BIG, progress=True)
        assert "upload: 100%" in capsys.readouterr().err
        client.upload(BIG)  # None: only from 64 MiB, on a terminal
        assert capsys.readouterr().err == ""


# Outputs by reference


def reference(name: str, array: np.ndarray, job_id: str = "j1") -> dict[str, Any]:
    return {
        "uri": f"tffleet://jobs/{job_id}/outputs/{name}",
        "dtype": array.dtype.name,
        "shape": list(array.shape),
    }


def succeeded(outputs: dict[str, Any]) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(200, json=wire_job(status="succeeded", outputs=outputs))


def test_an_output_given_by_reference_is_fetched_into_the_jobs_outputs() -> None:
    argmax = np.array([3, 1], dtype=np.int64)
    outputs = {"y": reference("y", BIG), "argmax": tensors.encode(argmax, encoding="b64")}
    server = Server({
        "/v1/jobs/j1": succeeded(outputs),
        "/v1/jobs/j1/outputs/y": lambda request: npy_response(BIG),
    })  # fmt: skip
    with server.client() as client:
        job = client.get("j1")

    assert job.outputs is not None and set(job.outputs) == {"y", "argmax"}
    np.testing.assert_array_equal(job.outputs["y"], BIG)
    np.testing.assert_array_equal(job.outputs["argmax"], argmax)
    job.outputs["y"][0, 0] = 1  # the caller's own array
    assert job.references is not None and job.references["y"].uri.endswith("/j1/outputs/y")
    fetch = server.requests[-1]
    assert fetch.headers["accept"] == tensors.NPY


def test_run_and_wait_fetch_them_too() -> None:
    y = samples(2)
    server = Server({
        "/v1/jobs": succeeded({"y": reference("y", y)}),
        "/v1/jobs/j1/outputs/y": lambda request: npy_response(y),
    })  # fmt: skip
    with server.client() as client:
        outputs = client.run("double", {"x": samples(2)})

    np.testing.assert_array_equal(outputs["y"], y)
    assert server.paths() == [("POST", "/v1/jobs"), ("GET", "/v1/jobs/j1/outputs/y")]


def test_an_output_that_is_not_what_the_job_said_is_a_protocol_error() -> None:
    server = Server({
        "/v1/jobs/j1": succeeded({"y": reference("y", BIG)}),
        "/v1/jobs/j1/outputs/y": lambda request: npy_response(samples(2)),
    })  # fmt: skip
    with server.client() as client, pytest.raises(ProtocolError, match="'y' of job j1"):
        client.get("j1")


def test_an_output_gone_from_the_store_raises_outputs_gone() -> None:
    def gone(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            410, json={"error": {"code": "outputs_gone", "message": "name: gone"}}
        )

    server = Server(
        {"/v1/jobs/j1": succeeded({"y": reference("y", BIG)}), "/v1/jobs/j1/outputs/y": gone}
    )
    with server.client() as client, pytest.raises(OutputsGone):
        client.get("j1")


def event_stream(job: dict[str, Any]) -> httpx.Response:
    data = orjson.dumps(job).decode()
    body = f"event: status\nid: 1\ndata: {data}\n\n".encode()
    return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=body)


def test_the_last_job_of_an_event_stream_has_its_stored_outputs_fetched() -> None:
    y = samples(3)
    done = wire_job(status="succeeded", outputs={"y": reference("y", y)})
    server = Server({
        "/v1/jobs/j1/events": lambda request: event_stream(done),
        "/v1/jobs/j1/outputs/y": lambda request: npy_response(y),
    })  # fmt: skip
    with server.client() as client:
        (seen,) = list(client.events("j1"))

    assert seen.outputs is not None
    np.testing.assert_array_equal(seen.outputs["y"], y)


@pytest.mark.anyio
async def test_the_async_client_fetches_them_as_the_blocking_one_does() -> None:
    y = samples(3)
    outputs = {"y": reference("y", y)}
    routes = {
        "/v1/jobs/j1": succeeded(outputs),
        "/v1/jobs/j1/events": lambda request: event_stream(
            wire_job(status="succeeded", outputs=outputs)
        ),
        "/v1/jobs/j1/outputs/y": lambda request: npy_response(y),
    }

    async def handler(request: httpx.Request) -> httpx.Response:
        return routes[request.url.path](request)

    transport = httpx.MockTransport(handler)
    async with AsyncClient("http://t", transport=transport, retries=NO_WAIT) as client:
        got = await client.get("j1")
        streamed = [job async for job in client.events("j1")]

    assert got.outputs is not None and streamed[-1].outputs is not None
    np.testing.assert_array_equal(got.outputs["y"], y)
    np.testing.assert_array_equal(streamed[-1].outputs["y"], y)


# Against the real API


def finish_storing(database_url: str, redis_url: str, store: ObjectStore, job_id: str) -> None:
    """Play the worker: read the job's inputs (from the store where they are references), run
    `fake_model`, write each output over DEFAULT_INLINE_MAX_BYTES (256 KiB, where the API's 8
    KiB would put every output in the store: one there, one inline) to the store as an .npy,
    the others inline, complete the job, and announce it."""
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions.begin() as session:
            (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="fake", lease_s=60)
        wanted = tensors.references(lease.inputs).values()
        objects = {ref.key: store.get(ref.key) for ref in wanted}
        outputs = fake_model(dict(tensors.unpack(lease.inputs, objects)))
        inline, references = {}, {}
        for name, array in outputs.items():
            if array.nbytes <= DEFAULT_INLINE_MAX_BYTES:
                inline[name] = array
                continue
            key = keys.output_key(DEFAULT_TENANT, job_id, name)
            body = tensors.write_npy(array)
            store.put(key, body)
            references[name] = tensors.Reference(
                key, array.dtype.name, array.shape, len(body) - array.nbytes, array.nbytes
            )
        with sessions.begin() as session:
            blob = tensors.pack(inline, references)
            assert jobs.complete(session=session, results=[(lease, blob)]) == 1
    finally:
        engine.dispose()
    with redis.Redis.from_url(redis_url) as client:
        client.publish(JOBS_DONE_CHANNEL, orjson.dumps([job_id]))


class Recorded(httpx.AsyncBaseTransport):
    """Records each request and passes it on as it is: a streamed body stays a stream."""

    def __init__(self, inner: httpx.AsyncBaseTransport, sent: list[httpx.Request]) -> None:
        self.inner, self.sent = inner, sent

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await self.inner.handle_async_request(request)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return (tmp_path / "objects").as_uri()


@pytest.fixture
async def in_process(
    request: pytest.FixtureRequest, sqlite_url: str, redis_url: str, store_url: str
) -> AsyncIterator[tuple[AsyncClient, list[httpx.Request]]]:
    """The app and an async client of it; the API's TFFLEET_MAX_BODY_BYTES its default (64
    MiB) unless a test gives another (`parametrize("in_process", [bytes], indirect=True)`)."""
    api_key = register_models(sqlite_url)
    settings = Settings(
        database_url=sqlite_url,
        broker_url=redis_url,
        object_store=store_url,
        max_body_bytes=getattr(request, "param", 64 * 1024 * 1024),
    )
    app = create_app(settings)
    sent: list[httpx.Request] = []
    async with app.router.lifespan_context(app):
        inner = Recorded(httpx.ASGITransport(app=app), sent)
        async with AsyncClient("http://tffleet", api_key=api_key, transport=inner) as client:
            yield client, sent


@pytest.mark.anyio
async def test_the_async_client_uploads_and_fetches_through_the_real_api(
    in_process: tuple[AsyncClient, list[httpx.Request]],
    sqlite_url: str,
    redis_url: str,
    store_url: str,
) -> None:
    client, sent = in_process
    job = await client.submit("double", {"x": BIG})
    finish_storing(sqlite_url, redis_url, open_store(store_url), job.id)

    done = await client.wait(job.id, timeout=20)

    # y (400 KB) is in the store, argmax inline: both came in the job's .npz answer, one request.
    assert done.ok and done.outputs is not None and done.references is None
    np.testing.assert_array_equal(done.outputs["y"], BIG * 2)
    np.testing.assert_array_equal(done.outputs["argmax"], np.full(len(BIG), 3))
    paths = [(r.method, r.url.path) for r in sent]
    assert paths[:2] == [("POST", "/v1/uploads"), ("POST", "/v1/jobs")]
    assert paths[2:] == [("GET", f"/v1/jobs/{job.id}")] * (len(paths) - 2)
    before = len(sent)
    got = await client.get(job.id)  # Client.get: one request too
    assert got.outputs is not None and [r.url.path for r in sent[before:]] == [f"/v1/jobs/{job.id}"]
    np.testing.assert_array_equal(got.outputs["y"], BIG * 2)
    assert (await client.upload(samples(2))).startswith("tffleet://uploads/")


@pytest.mark.anyio
@pytest.mark.parametrize("in_process", [64 * 1024], indirect=True)
async def test_outputs_past_the_apis_bound_come_as_references_and_are_fetched(
    in_process: tuple[AsyncClient, list[httpx.Request]],
    sqlite_url: str,
    redis_url: str,
    store_url: str,
) -> None:
    """Over TFFLEET_MAX_BODY_BYTES of stored outputs, the API answers JSON with references,
    and the client fetches each (`GET /v1/jobs/{id}/outputs/{name}`), as before."""
    client, sent = in_process
    job = await client.submit("double", {"x": BIG})
    finish_storing(sqlite_url, redis_url, open_store(store_url), job.id)

    done = await client.wait(job.id, timeout=20)

    assert done.ok and done.outputs is not None and done.references is not None
    assert set(done.references) == {"y"}
    np.testing.assert_array_equal(done.outputs["y"], BIG * 2)
    assert [(r.method, r.url.path) for r in sent][-2:] == [
        ("GET", f"/v1/jobs/{job.id}"),
        ("GET", f"/v1/jobs/{job.id}/outputs/y"),
    ]


def test_the_blocking_client_streams_an_upload_over_a_socket(served: Served) -> None:
    store = open_store(served.object_store)
    with Client(served.url, api_key=served.api_key) as client:
        uri = client.upload(BIG)
        job = client.submit("double", {"x": {"uri": uri}})
        finish_storing(served.database_url, served.redis_url, store, job.id)
        done = client.wait(job.id, timeout=20)

    assert done.outputs is not None and done.references is None  # in the .npz answer
    np.testing.assert_array_equal(done.outputs["y"], BIG * 2)
