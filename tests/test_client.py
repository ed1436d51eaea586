"""The Python client (`tffleet.Client`, `tffleet.AsyncClient`) and `tffleet submit`/`status`.

Three layers: unit tests on an `httpx.MockTransport` (what is sent, how answers and errors are
read, chunking, retries); the async client against the real app in-process (lifespan included,
SQLite and a real Redis); the blocking client and the CLI against `tffleet api` in a subprocess.
No worker runs: `FakeWorker` plays one through `db.jobs` and announces on the completion channel.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis
from sqlalchemy import select

import tffleet
from api.app import create_app
from db import jobs, registry
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import FINISHED, Job
from tests.conftest import REDIS_URL, service_missing
from tffleet import (
    AsyncClient,
    Client,
    ClientError,
    Conflict,
    ConnectError,
    HTTPStatusError,
    InvalidInput,
    JobCanceled,
    JobFailed,
    NotFound,
    ProtocolError,
    Retries,
    ServiceUnavailable,
    TransportError,
    WaitTimeout,
    tensors,
)
from tffleet.cli import main
from tffleet.cli.process_group import free_port
from tffleet.client import errors as client_errors
from tffleet.client.job import FINISHED as CLIENT_FINISHED
from tffleet.client.job import Job as ClientJob
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.settings import Settings

NO_WAIT = Retries(backoff_s=0)  # retries without back-off, for tests

# The fake fleet: name -> (inputs, outputs) of version 1.
SIGNATURES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "double": (
        {"x": {"dtype": "float32", "shape": [-1, 4]}},
        {
            "y": {"dtype": "float32", "shape": [-1, 4]},
            "argmax": {"dtype": "int64", "shape": [-1]},
        },
    ),
    "pair": (
        {"a": {"dtype": "float32", "shape": [-1, 3]}, "b": {"dtype": "int32", "shape": [-1, 2]}},
        {"total": {"dtype": "float64", "shape": [-1]}},
    ),
}


def fake_model(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if "x" in inputs:
        x = inputs["x"]
        return {"y": x * 2, "argmax": x.argmax(axis=1).astype(np.int64)}
    return {"total": inputs["a"].sum(axis=1, dtype=np.float64) + inputs["b"].sum(axis=1)}


def samples(n: int) -> np.ndarray:
    return np.arange(n * 4, dtype=np.float32).reshape(n, 4) / 7


# Unit tests: a scripted server on httpx.MockTransport


def wire_job(job_id: str = "j1", status: str = "queued", **fields: Any) -> dict[str, Any]:
    return {
        "id": job_id,
        "model": "double",
        "version": 1,
        "status": status,
        "priority": 0,
        "created_at": "2026-11-21T06:12:01.842612Z",
        "started_at": None,
        "finished_at": "2026-11-21T06:12:02Z" if status in CLIENT_FINISHED else None,
        "attempts": 1 if status != "queued" else 0,
        "error": None,
        "outputs": None,
        "worker": None,
        **fields,
    }


def error_response(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


class Recorder:
    """A MockTransport handler: records each request, answers with `answer(request)`."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response]) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)

    def bodies(self, path: str) -> list[Any]:
        return [orjson.loads(r.content) for r in self.requests if r.url.path == path]

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault("retries", NO_WAIT)
        return Client("http://tffleet.test", transport=httpx.MockTransport(self), **kwargs)

    def async_client(self, **kwargs: Any) -> AsyncClient:
        kwargs.setdefault("retries", NO_WAIT)
        return AsyncClient("http://tffleet.test", transport=httpx.MockTransport(self), **kwargs)


def accept_submits(request: httpx.Request) -> httpx.Response:
    body = orjson.loads(request.content)
    if "jobs" in body:
        return httpx.Response(
            202, json={"jobs": [wire_job(f"j{i}") for i in range(len(body["jobs"]))]}
        )
    return httpx.Response(202, json=wire_job())


def test_submit_sends_an_array_as_a_binary_envelope_and_lists_as_they_are() -> None:
    server = Recorder(accept_submits)
    x = samples(2)
    with server.client() as client:
        job = client.submit("double", x)
        client.submit("pair", {"a": [[1, 2, 3]], "b": np.array([[4, 5]], np.int32)}, version=2)
        client.submit("double", [[1, 2, 3, 4]], priority=-3)

    assert job.id == "j1" and job.status == "queued" and not job.finished
    first, second, third = server.bodies("/v1/jobs")
    assert first == {"model": "double", "inputs": tensors.encode(x, encoding="b64")}
    np.testing.assert_array_equal(tensors.decode(first["inputs"], dtype="float32"), x)
    assert second["version"] == 2 and second["inputs"]["a"] == [[1, 2, 3]]
    assert second["inputs"]["b"] == {
        "b64": second["inputs"]["b"]["b64"],
        "dtype": "int32",
        "shape": [1, 2],
    }
    assert third == {"model": "double", "inputs": [[1, 2, 3, 4]], "priority": -3}
    request = server.requests[0]
    assert request.method == "POST" and request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"].startswith("tffleet-client/")


@pytest.mark.parametrize(
    ("count", "chunk_size", "requests"), [(4096, 256, 16), (1000, 256, 4), (3, 256, 1)]
)
def test_submit_many_sends_one_bulk_request_per_chunk_and_keeps_the_order(
    count: int, chunk_size: int, requests: int
) -> None:
    server = Recorder(accept_submits)
    with server.client() as client:
        submitted = client.submit_many(
            "double", [samples(1) + i for i in range(count)], chunk_size=chunk_size
        )

    bodies = server.bodies("/v1/jobs")
    assert len(bodies) == requests == math.ceil(count / chunk_size)
    assert [len(body["jobs"]) for body in bodies][:-1] == [chunk_size] * (requests - 1)
    sent = [job for body in bodies for job in body["jobs"]]
    assert len(sent) == len(submitted) == count
    assert [tensors.decode(job["inputs"], dtype="float32")[0, 0] for job in sent] == [
        samples(1)[0, 0] + i for i in range(count)
    ]


def test_submit_many_also_cuts_chunks_at_a_byte_budget() -> None:
    server = Recorder(accept_submits)
    with server.client() as client:
        client.submit_many("double", [samples(64)] * 10, chunk_bytes=3000)  # ~1.4 kB a job
    bodies = [r.content for r in server.requests]
    assert [len(orjson.loads(b)["jobs"]) for b in bodies] == [2, 2, 2, 2, 2]
    assert all(len(body) <= 3000 for body in bodies)


def test_submit_many_refuses_a_chunk_size_the_api_would_not_take() -> None:
    with Recorder(accept_submits).client() as client, pytest.raises(ValueError, match="chunk_size"):
        client.submit_many("double", [samples(1)], chunk_size=10_001)


@pytest.mark.parametrize(
    ("message", "rebased"),
    [
        ("jobs[4]: inputs.x: expected dtype float32", "jobs[14]: inputs.x: expected dtype float32"),
        (
            "jobs.4.priority: too high; jobs.9.model: Field required",
            "jobs.14.priority: too high; jobs.19.model: Field required",
        ),
    ],
)
def test_a_refused_chunk_counts_jobs_from_the_first_and_lists_the_ones_stored(
    message: str, rebased: str
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if len(server.requests) == 2:
            return error_response(422, "invalid_input", message)
        return accept_submits(request)

    server = Recorder(answer)
    with server.client() as client, pytest.raises(InvalidInput) as caught:
        client.submit_many("double", [samples(1)] * 30, chunk_size=10)
    assert caught.value.message == rebased
    assert len(caught.value.submitted) == 10 and caught.value.status_code == 422


@pytest.mark.parametrize(
    ("status", "cls", "code"),
    [
        (400, client_errors.BadRequest, "malformed_request"),
        (404, NotFound, "job_not_found"),
        (409, Conflict, "job_finished"),
        (413, client_errors.PayloadTooLarge, "payload_too_large"),
        (415, client_errors.UnsupportedMediaType, "unsupported_media_type"),
        (422, InvalidInput, "invalid_input"),
        (429, client_errors.TooManyRequests, "queue_full"),
        (503, ServiceUnavailable, "unavailable"),
        (500, HTTPStatusError, "internal"),
    ],
)
def test_an_error_answer_raises_the_class_of_its_status_with_code_and_message(
    status: int, cls: type[HTTPStatusError], code: str
) -> None:
    server = Recorder(lambda _: error_response(status, code, "it is wrong here"))
    with server.client(retries=Retries(attempts=0)) as client, pytest.raises(cls) as caught:
        client.cancel("j1")
    error = caught.value
    assert type(error) is cls and isinstance(error, ClientError)
    assert (error.status_code, error.code, error.message) == (status, code, "it is wrong here")
    assert str(error) == f"{status} {code}: it is wrong here"


def test_an_error_page_that_is_not_json_still_raises_with_its_status() -> None:
    server = Recorder(lambda _: httpx.Response(502, text="<html>Bad Gateway</html>"))
    with server.client() as client, pytest.raises(HTTPStatusError) as caught:
        client.get("j1")
    assert caught.value.status_code == 502 and caught.value.code == "http_error"
    assert "Bad Gateway" in caught.value.message


def test_an_answer_that_is_not_the_contract_raises_protocol_error() -> None:
    not_json = Recorder(lambda _: httpx.Response(200, text="hello"))
    with not_json.client() as client, pytest.raises(ProtocolError, match="not JSON"):
        client.get("j1")
    not_a_job = Recorder(lambda _: httpx.Response(200, json={"id": "j1"}))
    with not_a_job.client() as client, pytest.raises(ProtocolError, match="not a job"):
        client.get("j1")


def flaky(failures: Sequence[Exception | int], then: httpx.Response) -> Recorder:
    """Fails the first requests (raising, or answering a status), then answers `then`."""

    def answer(request: httpx.Request) -> httpx.Response:
        n = len(server.requests) - 1
        if n < len(failures):
            failure = failures[n]
            if isinstance(failure, Exception):
                raise failure
            return error_response(failure, "unavailable", "database unreachable; try again")
        return then

    server = Recorder(answer)
    return server


def test_reads_are_retried_after_connection_errors_and_503() -> None:
    server = flaky(
        [httpx.ConnectError("refused"), 503, httpx.ReadError("reset")],
        httpx.Response(200, json=wire_job()),
    )
    with server.client() as client:
        assert client.get("j1").id == "j1"
    assert len(server.requests) == 4


def test_retries_give_up_after_their_attempts_with_the_last_error() -> None:
    server = flaky([503] * 10, httpx.Response(200, json=wire_job()))
    retries = Retries(attempts=2, backoff_s=0)
    with server.client(retries=retries) as client, pytest.raises(ServiceUnavailable):
        client.wait("j1")
    assert len(server.requests) == 3

    server = flaky([httpx.ConnectError("refused")] * 10, httpx.Response(200, json=wire_job()))
    retries = Retries(attempts=1, backoff_s=0)
    with server.client(retries=retries) as client, pytest.raises(ConnectError) as caught:
        client.models()
    assert "refused" in str(caught.value)
    assert isinstance(caught.value, TransportError) and len(server.requests) == 2


def test_a_submit_is_sent_again_under_the_same_idempotency_key() -> None:
    failures: list[Exception | int] = [
        httpx.ConnectError("refused"),
        httpx.ReadError("reset"),
        503,
        429,
    ]
    server = flaky(failures, httpx.Response(202, json=wire_job()))
    with server.client(retries=Retries(attempts=4, backoff_s=0)) as client:
        assert client.submit("double", [[1, 2, 3, 4]]).id == "j1"
        client.submit("double", [[1, 2, 3, 4]])
        client.submit("double", [[1, 2, 3, 4]], idempotency_key="order-1234")
    keys = [request.headers["idempotency-key"] for request in server.requests]
    assert len(keys) == 7 and len(set(keys[:5])) == 1  # the first submit, tried five times
    assert keys[5] != keys[0] and keys[6] == "order-1234"


def test_submit_many_gives_each_request_its_own_key_or_numbers_the_callers() -> None:
    server = Recorder(accept_submits)
    with server.client() as client:
        client.submit_many("double", [[[1, 2, 3, 4]]] * 5, chunk_size=2)
        client.submit_many("double", [[[1, 2, 3, 4]]] * 5, chunk_size=2, idempotency_key="run-7")
    keys = [request.headers["idempotency-key"] for request in server.requests]
    assert len(set(keys[:3])) == 3 and keys[3:] == ["run-7.0", "run-7.1", "run-7.2"]


def test_retries_back_off_between_tries() -> None:
    retries = Retries(attempts=5, backoff_s=0.1, max_backoff_s=0.3)
    delays = [retries.delay_s(n) for n in range(5)]
    assert 0.05 <= delays[0] <= 0.1 and all(0.15 <= d <= 0.3 for d in delays[2:])


def test_wait_long_polls_in_rounds_with_a_read_timeout_above_the_hold() -> None:
    answers = iter(
        [wire_job(status="queued"), wire_job(status="running"), wire_job(status="succeeded")]
    )
    server = Recorder(lambda _: httpx.Response(200, json=next(answers)))
    with server.client(timeout=5.0) as client:
        job = client.wait("j1")
    assert job.status == "succeeded" and job.finished and job.ok
    assert len(server.requests) == 3
    for request in server.requests:
        assert request.method == "GET" and request.url.path == "/v1/jobs/j1"
        assert dict(request.url.params) == {"encoding": "b64", "wait": "30.000"}
        assert request.extensions["timeout"]["read"] == pytest.approx(35.0)
        assert request.extensions["timeout"]["connect"] == pytest.approx(5.0)


def test_wait_raises_wait_timeout_with_the_job_as_last_seen() -> None:
    server = Recorder(lambda _: httpx.Response(200, json=wire_job(status="running")))
    started = time.monotonic()
    with server.client() as client, pytest.raises(WaitTimeout) as caught:
        client.wait("j1", timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 2
    assert isinstance(caught.value, TimeoutError)  # the builtin one too
    assert [job.status for job in caught.value.jobs] == ["running"]
    assert 0.2 < float(server.requests[0].url.params["wait"]) <= 0.3  # held no longer than left
    assert len(server.requests) <= 0.3 / 0.05 + 2  # rounds paced, not a tight loop


def status_server(rounds: dict[str, int]) -> Recorder:
    """Bulk status: job `id` finishes on the `rounds[id]`th time it is read."""
    seen: dict[str, int] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        out = []
        for job_id in orjson.loads(request.content)["ids"]:
            seen[job_id] = seen.get(job_id, 0) + 1
            done = seen[job_id] >= rounds[job_id]
            y = {"y": tensors.encode(np.full((1, 4), len(job_id), np.float32), encoding="b64")}
            out.append(
                wire_job(job_id, "succeeded" if done else "running", outputs=y if done else None)
            )
        return httpx.Response(200, json={"jobs": out})

    return Recorder(answer)


def test_wait_all_rereads_only_the_unfinished_jobs_and_returns_them_in_order() -> None:
    server = status_server({"a": 1, "bb": 3, "ccc": 2})
    with server.client() as client:
        done = client.wait_all(["ccc", "a", "bb", "a"])
    assert [job.id for job in done] == ["ccc", "a", "bb", "a"]
    assert all(job.ok for job in done)
    assert [job.outputs["y"][0, 0] for job in done if job.outputs] == [3, 1, 2, 1]
    assert [body["ids"] for body in server.bodies("/v1/jobs/status")] == [
        ["ccc", "a", "bb"],
        ["ccc", "bb"],
        ["bb"],
    ]
    assert {body["encoding"] for body in server.bodies("/v1/jobs/status")} == {"b64"}


def test_wait_all_reads_many_ids_in_chunks_and_holds_only_the_first() -> None:
    ids = [f"job{i}" for i in range(2500)]
    server = status_server(dict.fromkeys(ids, 1))
    with server.client() as client:
        assert len(client.wait_all(ids)) == 2500
    bodies = server.bodies("/v1/jobs/status")
    assert [len(body["ids"]) for body in bodies] == [1000, 1000, 500]
    assert [body["wait"] for body in bodies] == [30.0, 0, 0]


def test_wait_all_timeout_carries_every_job_as_last_seen() -> None:
    server = status_server({"a": 1, "b": 10**6})
    with server.client() as client, pytest.raises(WaitTimeout, match="1 of 2 jobs") as caught:
        client.wait_all(["a", "b"], timeout=0.2)
    assert [(job.id, job.status) for job in caught.value.jobs] == [
        ("a", "succeeded"),
        ("b", "running"),
    ]


def test_wait_all_shows_a_progress_bar_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    with status_server({"a": 1, "b": 2, "c": 2}).client() as client:
        client.wait_all(["a", "b", "c"], progress=True)
        assert "wait: 100%" in capsys.readouterr().err
        client.wait_all(["a", "b", "c"])  # None: only on a terminal, for many jobs
        assert capsys.readouterr().err == ""


@pytest.mark.anyio
async def test_the_async_client_sends_what_the_blocking_one_sends() -> None:
    def shapes(server: Recorder) -> list[tuple[str, str, bytes]]:
        return [(r.method, str(r.url), r.content) for r in server.requests]

    batches = [samples(1) + i for i in range(600)]
    blocking, awaited = Recorder(accept_submits), Recorder(accept_submits)
    with blocking.client() as client:
        client.submit_many("double", batches, chunk_size=250)
        client.submit("pair", {"a": samples(1)[:, :3], "b": [[1, 2]]}, version=1, priority=2)
    async with awaited.async_client() as aclient:
        await aclient.submit_many("double", batches, chunk_size=250)
        await aclient.submit("pair", {"a": samples(1)[:, :3], "b": [[1, 2]]}, version=1, priority=2)
    assert shapes(blocking) == shapes(awaited) and len(blocking.requests) == 4

    blocking, awaited = status_server({"a": 2, "b": 3}), status_server({"a": 2, "b": 3})
    with blocking.client() as client:
        expected = client.wait_all(["a", "b"])
    async with awaited.async_client() as aclient:
        got = await aclient.wait_all(["a", "b"])
    assert shapes(blocking) == shapes(awaited)
    assert [job.id for job in got] == [job.id for job in expected]


@pytest.mark.anyio
async def test_the_async_client_retries_and_maps_errors_the_same_way() -> None:
    server = flaky([httpx.ConnectError("refused"), 503], httpx.Response(200, json=wire_job()))
    async with server.async_client() as aclient:
        assert (await aclient.get("j1")).id == "j1"
    assert len(server.requests) == 3
    async with Recorder(
        lambda _: error_response(404, "job_not_found", "job 'x' not found")
    ).async_client() as aclient:
        with pytest.raises(NotFound, match="job 'x' not found"):
            await aclient.get("x")


def test_job_values_say_whether_they_finished_and_raise_for_their_error() -> None:
    failed = ClientJob.from_wire(
        wire_job(status="failed", error={"code": "model_error", "message": "bad shape"})
    )
    assert failed.finished and not failed.ok
    with pytest.raises(JobFailed, match="model_error: bad shape") as caught:
        failed.raise_for_error()
    assert caught.value.job is failed
    with pytest.raises(JobCanceled):
        ClientJob.from_wire(wire_job(status="canceled")).raise_for_error()
    queued = ClientJob.from_wire(wire_job())
    assert queued.raise_for_error() is queued and not queued.finished
    assert queued.created_at.tzinfo is not None
    assert ClientJob.from_wire(orjson.loads(orjson.dumps(queued.to_dict()))) == queued


def test_the_client_knows_the_same_finished_statuses_as_the_database() -> None:
    assert {status.value for status in FINISHED} == CLIENT_FINISHED


def test_importing_tffleet_stays_cheap() -> None:
    code = (
        "import sys, tffleet\n"
        "heavy = {'httpx', 'numpy', 'sqlalchemy', 'tensorflow', 'api', 'worker', 'db', 'celery'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
        "tffleet.Client, tffleet.AsyncClient, tffleet.InvalidInput\n"
        "assert not {'tensorflow', 'api', 'worker', 'db', 'celery'} & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert tffleet.ClientError is client_errors.ClientError
    assert set(tffleet.__all__) <= set(dir(tffleet))


# Playing the worker


def register_models(database_url: str) -> None:
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        for name, (inputs, outputs) in SIGNATURES.items():
            registry.register(
                session=session,
                name=name,
                version=1,
                format="savedmodel",
                inputs=inputs,
                outputs=outputs,
            )
    engine.dispose()


class FakeWorker:
    """Claims queued jobs, runs `fake_model` (or fails them), writes the results through db.jobs
    as a worker does, and announces them on the completion channel so long-polls wake."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self._engine = make_engine(database_url)
        self._sessions = make_sessionmaker(self._engine)
        self._redis = redis.Redis.from_url(redis_url)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def finish(self, job_ids: Sequence[str], *, fail: str | None = None) -> list[str]:
        with self._sessions.begin() as session:
            leases = jobs.claim(session=session, job_ids=list(job_ids), owner="fake", lease_s=60)
        if not leases:
            return []
        with self._sessions.begin() as session:
            if fail is not None:
                jobs.fail(session=session, leases=leases, code="model_error", message=fail)
            else:
                results = [
                    (lease, tensors.pack(fake_model(tensors.unpack(lease.inputs))))
                    for lease in leases
                ]
                jobs.complete(session=session, results=results)
        ids = [lease.job_id for lease in leases]
        self._redis.publish(JOBS_DONE_CHANNEL, orjson.dumps(ids))
        return ids

    def queued(self, model: str) -> list[str]:
        with self._sessions() as session:
            query = (
                select(Job.id).where(Job.model == model, Job.status == "queued").order_by(Job.id)
            )
            return list(session.scalars(query))

    def serve(self, model: str, *, delay_s: float = 0.05, fail: str | None = None) -> None:
        """From a thread: finish every queued job of `model`, each some `delay_s` after it came."""

        def run() -> None:
            try:
                while not self._stop.wait(delay_s):
                    if ids := self.queued(model):
                        self.finish(ids, fail=fail)
            except BaseException as exc:  # surfaced in the test by close()
                self.errors.append(exc)

        thread = threading.Thread(target=run, name=f"fake-worker-{model}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._redis.close()
        self._engine.dispose()
        if self.errors:
            raise self.errors[0]


# The async client against the app in-process


class Recording(httpx.AsyncBaseTransport):
    """Records requests; loses the next `lose_answers` answers after the app has handled them."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[httpx.Request] = []
        self.lose_answers = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = await self.inner.handle_async_request(request)
        if self.lose_answers:
            self.lose_answers -= 1
            await response.aclose()
            raise httpx.ReadError("connection reset after the request went out")
        return response


@dataclass
class InProcess:
    client: AsyncClient
    transport: Recording
    worker: FakeWorker

    def submits(self) -> int:
        return sum(
            1 for r in self.transport.requests if r.method == "POST" and r.url.path == "/v1/jobs"
        )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def api(sqlite_url: str, redis_url: str) -> AsyncIterator[InProcess]:
    register_models(sqlite_url)
    app = create_app(Settings(database_url=sqlite_url, broker_url=redis_url))
    worker = FakeWorker(sqlite_url, redis_url)
    try:
        async with app.router.lifespan_context(app):
            transport = Recording(httpx.ASGITransport(app=app))
            async with AsyncClient("http://tffleet", transport=transport) as client:
                yield InProcess(client, transport, worker)
    finally:
        worker.close()


@pytest.mark.anyio
async def test_submit_wait_get_roundtrip_decodes_b64_outputs_to_the_arrays_written(
    api: InProcess,
) -> None:
    x = samples(3)
    job = await api.client.submit("double", x, priority=7)
    assert (job.status, job.model, job.version, job.priority, job.outputs) == (
        "queued",
        "double",
        1,
        7,
        None,
    )

    api.worker.serve("double")
    done = await api.client.wait(job.id, timeout=20)
    assert done.ok and done.id == job.id and done.attempts == 1 and done.worker == "fake"
    assert done.finished_at is not None and done.started_at is not None
    assert done.outputs is not None and set(done.outputs) == {"y", "argmax"}
    np.testing.assert_array_equal(done.outputs["y"], x * 2)
    assert done.outputs["y"].dtype == np.float32 and done.outputs["argmax"].dtype == np.int64
    np.testing.assert_array_equal(done.outputs["argmax"], [3, 3, 3])

    again = await api.client.get(job.id)
    assert again.status == "succeeded" and again.outputs is not None
    np.testing.assert_array_equal(again.outputs["y"], x * 2)
    as_lists = await api.client.get(job.id, encoding="json")
    assert as_lists.outputs is not None
    np.testing.assert_allclose(as_lists.outputs["y"], x * 2, rtol=1e-6)


@pytest.mark.anyio
async def test_run_returns_the_outputs_of_named_inputs(api: InProcess) -> None:
    api.worker.serve("pair")
    a = samples(2)[:, :3]
    outputs = await api.client.run("pair", {"a": a, "b": [[1, 2], [3, 4]]}, timeout=20)
    np.testing.assert_allclose(outputs["total"], a.sum(axis=1) + np.array([3, 7]), rtol=1e-6)
    assert outputs["total"].dtype == np.float64
    outputs["total"] += 1  # outputs are the caller's own arrays
    # Submitted and waited for in one round trip (POST ?wait=).
    assert [(r.method, r.url.path) for r in api.transport.requests] == [("POST", "/v1/jobs")]


@pytest.mark.anyio
async def test_run_raises_job_failed_with_the_job_and_its_error(api: InProcess) -> None:
    api.worker.serve("double", fail="shapes do not broadcast")
    with pytest.raises(JobFailed, match="model_error: shapes do not broadcast") as caught:
        await api.client.run("double", samples(1), timeout=20)
    assert caught.value.job.status == "failed" and caught.value.job.error is not None
    assert caught.value.job.error.code == "model_error"


@pytest.mark.anyio
async def test_submit_many_of_1000_samples_makes_one_request_a_chunk_and_keeps_their_order(
    api: InProcess,
) -> None:
    x = samples(1000)
    submitted = await api.client.submit_many("double", [x[i : i + 1] for i in range(1000)])
    assert api.submits() == math.ceil(1000 / 256)
    assert len(submitted) == len({job.id for job in submitted}) == 1000
    assert [job.id for job in submitted] == sorted(job.id for job in submitted)  # time-ordered ids

    api.worker.serve("double")
    done = await api.client.wait_all([job.id for job in submitted], timeout=60)
    assert [job.id for job in done] == [job.id for job in submitted]
    assert all(job.ok for job in done)
    # Each job holds its own sample: the order was kept from the list to the rows.
    got = np.concatenate([job.outputs["y"] for job in done if job.outputs is not None])
    np.testing.assert_array_equal(got, x * 2)


@pytest.mark.anyio
async def test_wait_all_returns_every_job_finished_failed_ones_included(api: InProcess) -> None:
    ok = await api.client.submit_many("double", [samples(1)] * 5)
    bad = await api.client.submit("pair", {"a": [[1, 2, 3]], "b": [[1, 2]]})
    canceled = await api.client.submit("double", samples(2))
    await api.client.cancel(canceled.id)
    api.worker.serve("double")
    api.worker.serve("pair", fail="out of memory")

    ids = [bad.id, *(job.id for job in ok), canceled.id]
    done = await api.client.wait_all(ids, timeout=30)
    assert [job.id for job in done] == ids
    assert [job.status for job in done] == ["failed", *["succeeded"] * 5, "canceled"]
    # Each round re-read only what was unfinished: no id was asked for after it ended.
    reads = [
        orjson.loads(r.content)["ids"]
        for r in api.transport.requests
        if r.url.path == "/v1/jobs/status"
    ]
    assert reads[0] == ids and all(canceled.id not in r for r in reads[1:])


@pytest.mark.anyio
async def test_wait_times_out_on_a_job_nobody_runs(api: InProcess) -> None:
    job = await api.client.submit("double", samples(1))
    with pytest.raises(WaitTimeout) as caught:
        await api.client.wait(job.id, timeout=0.5)
    assert [j.status for j in caught.value.jobs] == ["queued"]


@pytest.mark.anyio
async def test_inputs_that_do_not_fit_raise_invalid_input_naming_the_field(api: InProcess) -> None:
    with pytest.raises(InvalidInput) as caught:
        await api.client.submit("double", samples(2).astype(np.float64))
    assert caught.value.status_code == 422 and caught.value.code == "invalid_input"
    assert caught.value.message.startswith("inputs.x:") and "float32" in caught.value.message

    inputs = [samples(1)] * 300
    inputs[270] = samples(1)[:, :3]
    with pytest.raises(InvalidInput, match=r"^422 invalid_input: jobs\[270\]: inputs.x") as bulk:
        await api.client.submit_many("double", inputs, chunk_size=100)
    assert len(bulk.value.submitted) == 200  # the two requests before the refused one


@pytest.mark.anyio
async def test_unknown_job_or_model_raises_not_found(api: InProcess) -> None:
    with pytest.raises(NotFound) as caught:
        await api.client.get("01a1fcbb-b2b2-7703-87f2-c82a338327c2")
    assert caught.value.status_code == 404 and caught.value.code == "job_not_found"
    with pytest.raises(NotFound, match="no model named 'nope'"):
        await api.client.submit("nope", [[1.0]])
    with pytest.raises(NotFound):
        await api.client.wait_all(["a/b?c"])


@pytest.mark.anyio
async def test_cancel_of_a_finished_job_raises_conflict(api: InProcess) -> None:
    queued = await api.client.submit("double", samples(1))
    canceled = await api.client.cancel(queued.id)
    assert canceled.status == "canceled" and canceled.finished and not canceled.ok
    assert (await api.client.cancel(queued.id)).status == "canceled"  # again: not an error
    with pytest.raises(JobCanceled):
        (await api.client.wait(queued.id)).raise_for_error()

    finished = await api.client.submit("double", samples(1))
    api.worker.finish([finished.id])
    with pytest.raises(Conflict) as caught:
        await api.client.cancel(finished.id)
    assert caught.value.status_code == 409 and finished.id in caught.value.message


@pytest.mark.anyio
async def test_a_submit_whose_answer_was_lost_is_sent_again_and_stored_once(
    api: InProcess,
) -> None:
    api.transport.lose_answers = 1
    job = await api.client.submit("double", samples(1))
    assert api.submits() == 2 and api.worker.queued("double") == [job.id]

    api.transport.lose_answers = 2
    many = await api.client.submit_many("double", [samples(1)] * 10, chunk_size=4)
    assert api.submits() == 2 + 3 + 2  # the first chunk answered on its third try
    assert api.worker.queued("double") == [job.id, *(j.id for j in many)]


@pytest.mark.anyio
async def test_the_same_idempotency_key_gets_the_same_jobs_and_other_inputs_a_conflict(
    api: InProcess,
) -> None:
    first = await api.client.submit("double", samples(2), idempotency_key="order-1")
    again = await api.client.submit("double", samples(2), idempotency_key="order-1")
    assert again.id == first.id
    with pytest.raises(Conflict) as caught:
        await api.client.submit("double", samples(3), idempotency_key="order-1")
    assert caught.value.code == "idempotency_key_reused"

    batch = [samples(1) + i for i in range(5)]
    many = await api.client.submit_many("double", batch, chunk_size=2, idempotency_key="run-1")
    replay = await api.client.submit_many("double", batch, chunk_size=2, idempotency_key="run-1")
    assert [j.id for j in replay] == [j.id for j in many]
    assert len(api.worker.queued("double")) == 1 + 5


@pytest.mark.anyio
async def test_models_lists_the_registered_signatures(api: InProcess) -> None:
    models = {m.name: m for m in await api.client.models()}
    assert set(models) == set(SIGNATURES)
    double = models["double"]
    assert double.version == 1 and double.inputs["x"].dtype == "float32"
    assert double.inputs["x"].shape == [-1, 4] and double.outputs["argmax"].dtype == "int64"


# The blocking client and the CLI against `tffleet api` in a subprocess


@dataclass
class Served:
    url: str
    database_url: str
    redis_url: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`tffleet api` on a free port, on its own SQLite file and the test run's Redis database."""
    try:
        with redis.Redis.from_url(REDIS_URL) as client:
            client.ping()
    except redis.RedisError as exc:
        service_missing("Redis", exc)
    path = tmp_path_factory.mktemp("served")
    database_url = f"sqlite:///{path / 'tffleet.db'}"
    upgrade(database_url)
    register_models(database_url)
    port = free_port()
    env = {
        **os.environ,
        "TFFLEET_DATABASE_URL": database_url,
        "TFFLEET_BROKER_URL": REDIS_URL,
        "TFFLEET_API_PORT": str(port),
    }
    with (path / "api.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "api"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tffleet api did not start:\n{(path / 'api.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield Served(url, database_url, REDIS_URL)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def worker(served: Served) -> Iterator[FakeWorker]:
    fake = FakeWorker(served.database_url, served.redis_url)
    yield fake
    fake.close()


@pytest.mark.slow
def test_the_blocking_client_submits_waits_and_runs_against_a_served_api(
    served: Served, worker: FakeWorker
) -> None:
    worker.serve("double")
    x = samples(4)
    with Client(served.url) as client:
        job = client.submit("double", x)
        done = client.wait(job.id, timeout=20).raise_for_error()
        assert done.outputs is not None
        np.testing.assert_array_equal(done.outputs["y"], x * 2)
        np.testing.assert_array_equal(client.run("double", x[:1], timeout=20)["y"], x[:1] * 2)

        many = client.submit_many("double", [x[i : i + 1] for i in range(4)], chunk_size=3)
        finished = client.wait_all([j.id for j in many], timeout=20)
        assert [j.id for j in finished] == [j.id for j in many] and all(j.ok for j in finished)
        assert [j.status for j in client.get_many([many[1].id, job.id])] == ["succeeded"] * 2


@pytest.mark.slow
def test_the_blocking_client_reports_an_api_that_is_not_there() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, retries=NO_WAIT) as client, pytest.raises(ConnectError) as caught:
        client.get("j1")
    assert f"GET {url}/v1/jobs/j1" in str(caught.value)


@pytest.mark.slow
def test_cli_submit_wait_prints_the_finished_job_as_json(
    served: Served, worker: FakeWorker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = samples(2)
    np.save(tmp_path / "x.npy", x)
    worker.serve("double")
    assert main(["submit", "double", str(tmp_path / "x.npy"), "--wait", "--url", served.url]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    job = orjson.loads(line)
    assert job["status"] == "succeeded" and job["model"] == "double"
    np.testing.assert_allclose(job["outputs"]["y"], x * 2)

    assert main(["status", job["id"], "--url", served.url]) == 0
    assert orjson.loads(capsys.readouterr().out)["id"] == job["id"]


@pytest.mark.slow
def test_cli_submit_split_sends_one_job_a_sample_and_saves_the_batch_back(
    served: Served,
    worker: FakeWorker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = samples(5)
    np.savez(tmp_path / "in.npz", x=x)
    worker.serve("double")
    monkeypatch.setenv("TFFLEET_URL", served.url)
    out = tmp_path / "out.npz"
    assert (
        main(["submit", "double", str(tmp_path / "in.npz"), "--split", "--output", str(out)]) == 0
    )
    assert "saved the outputs of 5 job(s)" in capsys.readouterr().err
    with np.load(out) as saved:
        np.testing.assert_array_equal(saved["y"], x * 2)
        np.testing.assert_array_equal(saved["argmax"], [3] * 5)

    # Without --wait: the ids, one a line, in order.
    assert main(["submit", "double", str(tmp_path / "in.npz"), "--split"]) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == 5 and ids == sorted(ids)
    assert main(["status", *ids, "--wait", "20"]) == 0
    statuses = [orjson.loads(line)["status"] for line in capsys.readouterr().out.splitlines()]
    assert statuses == ["succeeded"] * 5


@pytest.mark.slow
def test_cli_submit_reports_what_the_api_refused(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.json").write_text('{"x": [[1, 2, 3]]}')
    assert main(["submit", "double", str(tmp_path / "in.json"), "--url", served.url]) == 1
    assert "422 invalid_input: inputs.x: dimension 1 must be 4" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.npy", None, "missing.npy: no such file"),
        ("x.txt", b"1 2 3", "x.txt: expected a .npy, .npz or .json file"),
        ("broken.npy", b"not numpy", "broken.npy: not a valid .npy file"),
        ("broken.npz", b"not a zip", "broken.npz: not a valid .npz file"),
        ("broken.json", b"{", "broken.json: not a valid .json file"),
    ],
)
def test_cli_submit_of_a_bad_file_says_which_and_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: bytes | None,
    message: str,
) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content)
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert main(["submit", "double", str(tmp_path / name), "--url", unreachable]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tffleet: ") and message in err


def test_cli_submit_split_needs_a_batch_and_output_needs_npz(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scalar.json").write_text('{"x": 3}')
    assert main(["submit", "double", str(tmp_path / "scalar.json"), "--split"]) == 2
    assert "--split needs tensors with a batch dimension" in capsys.readouterr().err
    np.save(tmp_path / "x.npy", samples(1))
    assert main(["submit", "double", str(tmp_path / "x.npy"), "--output", "out.csv"]) == 2
    assert "--output must name a .npz file" in capsys.readouterr().err
