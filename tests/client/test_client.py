"""The Python client (`tffleet.Client`, `tffleet.AsyncClient`) on an `httpx.MockTransport`: what
is sent, how answers and errors are read, chunking, retries. No server runs; a scripted handler
(`Recorder`) answers. tests/client/test_against_api.py runs the clients against the real API.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

import tffleet
from db.models import FINISHED
from tests.client.fleet import NO_WAIT, samples
from tffleet import (
    AsyncClient,
    Client,
    ClientError,
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
    errors,
    tensors,
)
from tffleet.client import errors as client_errors
from tffleet.client import waiting
from tffleet.client.job import BINARY_BODY_MIN_BYTES
from tffleet.client.job import FINISHED as CLIENT_FINISHED
from tffleet.client.job import Job as ClientJob
from tffleet.client.protocol import ACCEPT_NPZ

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
    ("status", "code", "cls"),
    [
        (400, "malformed_request", errors.InvalidRequest),
        (401, "unauthorized", errors.Unauthorized),
        (403, "forbidden", errors.Forbidden),
        (404, "job_not_found", errors.JobNotFound),
        (404, "model_not_found", errors.ModelNotFound),
        (409, "job_finished", errors.JobAlreadyFinished),
        (409, "not_retryable", errors.JobNotRetryable),
        (410, "inputs_gone", errors.InputsGone),
        (413, "payload_too_large", errors.PayloadTooLarge),
        (415, "unsupported_media_type", errors.UnsupportedMediaType),
        (422, "invalid_input", errors.InvalidInput),
        (429, "queue_full", errors.QueueFull),
        (429, "quota_exceeded", errors.QuotaExceeded),
        (429, "rate_limited", errors.RateLimited),
        (403, "model_not_allowed", errors.ModelNotAllowed),
        (503, "unavailable", errors.ServiceUnavailable),
        # A code this client does not know (one the API added since): the class of its status.
        (400, "bad_cursor", errors.BadRequest),
        (404, "tenant_not_found", errors.NotFound),
        (410, "purged", errors.Gone),
        (429, "slow_down", errors.TooManyRequests),
        # A code of another status is not believed: the status decides.
        (404, "queue_full", errors.NotFound),
        # A status the API never answers with: a plain HTTPStatusError.
        (500, "internal", HTTPStatusError),
    ],
)
def test_an_error_answer_raises_the_class_of_its_status_and_code_with_what_was_sent(
    status: int, code: str, cls: type[HTTPStatusError]
) -> None:
    server = Recorder(lambda _: error_response(status, code, "it is wrong here"))
    with server.client(retries=Retries(attempts=0)) as client, pytest.raises(cls) as caught:
        client.cancel("j1")
    error = caught.value
    assert type(error) is cls and isinstance(error, ClientError)
    assert (error.status_code, error.code, error.message) == (status, code, "it is wrong here")
    assert str(error) == f"{status} {code}: it is wrong here"
    assert error.response is not None and error.response.status_code == status


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


def flaky(failures: Sequence[Exception | int | httpx.Response], then: httpx.Response) -> Recorder:
    """Fails the first requests (raising, or answering a status or a response), then answers
    `then`."""

    def answer(request: httpx.Request) -> httpx.Response:
        n = len(server.requests) - 1
        if n < len(failures):
            failure = failures[n]
            if isinstance(failure, Exception):
                raise failure
            if isinstance(failure, httpx.Response):
                return failure
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
    # An answer's Retry-After goes instead, up to max_retry_after_s.
    assert retries.delay_s(0, retry_after_s=1.5) == 1.5
    assert retries.delay_s(0, retry_after_s=600) == retries.max_retry_after_s


def test_a_429_is_tried_again_after_its_retry_after() -> None:
    limited = httpx.Response(
        429,
        headers={"Retry-After": "0.3"},
        json={"error": {"code": "rate_limited", "message": "key abc is over its rate"}},
    )
    server = flaky([limited], httpx.Response(202, json=wire_job()))
    started = time.monotonic()
    with server.client(retries=Retries(attempts=2, backoff_s=0)) as client:
        assert client.submit("double", [[1, 2, 3, 4]]).id == "j1"
    assert time.monotonic() - started >= 0.3 and len(server.requests) == 2


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


def test_wait_all_holds_the_oldest_ids_until_all_end_and_reads_no_others() -> None:
    ids = [f"job{i}" for i in range(2500)]
    server = status_server({**dict.fromkeys(ids, 1), "job7": 2})
    with server.client() as client:
        assert len(client.wait_all(ids)) == 2500
    bodies = server.bodies("/v1/jobs/status")
    assert (
        [body["ids"] for body in bodies]
        == [
            ids[:1000],
            ["job7", *ids[1000:1999]],  # the one still running first, then the next oldest
            ids[1999:],
        ]
    )
    assert {(body["wait"], body["until"]) for body in bodies} == {(30.0, "all")}


def test_wait_all_timeout_reads_the_jobs_no_round_held() -> None:
    ids = [f"job{i}" for i in range(1500)]
    statuses = status_server({**dict.fromkeys(ids, 1), "job0": 10**6}).answer

    def answer(request: httpx.Request) -> httpx.Response:
        held = orjson.loads(request.content)["wait"]
        time.sleep(held)  # as the API holds a request while job0 runs
        return statuses(request)

    server = Recorder(answer)
    with server.client() as client, pytest.raises(WaitTimeout, match="1 of 1500 jobs") as caught:
        client.wait_all(ids, timeout=0.3)
    assert [job.id for job in caught.value.jobs] == ids
    assert server.bodies("/v1/jobs/status")[-1] == {"ids": ids[1000:], "encoding": "b64", "wait": 0}


def test_wait_all_holds_a_round_a_second_at_most_while_its_bar_shows() -> None:
    server = status_server({"a": 1, "b": 2})
    with server.client() as client:
        client.wait_all(["a", "b"], progress=True)
    assert {body["wait"] for body in server.bodies("/v1/jobs/status")} == {waiting.PROGRESS_ROUND_S}


def test_wait_all_against_an_api_from_before_until_holds_until_one_ends() -> None:
    """Such an API refuses the field (422 naming it): the rounds go on without it."""
    seen: dict[str, int] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        if "until" in body:
            error = {"code": "invalid_input", "message": "until: Extra inputs are not permitted"}
            return httpx.Response(422, json={"error": error})
        out = []
        for job_id in body["ids"]:
            seen[job_id] = seen.get(job_id, 0) + 1
            out.append(wire_job(job_id, "succeeded" if seen[job_id] >= 2 else "running"))
        return httpx.Response(200, json={"jobs": out})

    server = Recorder(answer)
    with server.client() as client:
        assert [job.status for job in client.wait_all(["a", "b"])] == ["succeeded"] * 2
    assert [body.get("until") for body in server.bodies("/v1/jobs/status")] == ["all", None, None]


def test_wait_all_lets_completions_gather_longer_while_many_jobs_are_pending() -> None:
    """Each round costs the API a read of every pending job: many pending, fewer rounds."""
    assert waiting._gather_s(1) == pytest.approx(0.06)
    assert waiting._gather_s(16) == pytest.approx(0.21)
    assert waiting._gather_s(10_000) == waiting.MAX_ROUND_S


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
        shown = capsys.readouterr().err
        # Counts and the time waited, no rate: results collected per second mean nothing.
        assert "wait: 100%" in shown and "3/3 ended [00:0" in shown and "/s" not in shown
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


@pytest.mark.slow  # starts a process
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


# Large arrays: a binary body out, an .npz answer back


def accept_one(request: httpx.Request) -> httpx.Response:
    return httpx.Response(202, json=wire_job())


def npz_answer(job: dict[str, Any], outputs: dict[str, np.ndarray]) -> httpx.Response:
    return httpx.Response(
        200,
        content=tensors.write_npz(outputs),
        headers={"Content-Type": tensors.NPZ, "Tffleet-Job": orjson.dumps(job).decode()},
    )


def rows_of(nbytes: int) -> np.ndarray:
    """float32 samples of the `double` model holding `nbytes` (a multiple of 16)."""
    return samples(nbytes // 16)


def test_inputs_of_binary_body_min_bytes_or_more_go_as_an_npz_body() -> None:
    server = Recorder(accept_one)
    large, small = rows_of(BINARY_BODY_MIN_BYTES), rows_of(BINARY_BODY_MIN_BYTES - 16)
    with server.client() as client:
        client.submit("double", {"x": large}, version=3, priority=-2, idempotency_key="k-1")
        client.submit("double", {"x": small})

    binary, as_json = server.requests
    assert binary.headers["content-type"] == tensors.NPZ
    assert dict(binary.url.params) == {"model": "double", "version": "3", "priority": "-2"}
    assert binary.headers["idempotency-key"] == "k-1"
    with np.load(io.BytesIO(binary.content)) as archive:  # numpy's own reader
        assert archive.files == ["x"]
        np.testing.assert_array_equal(archive["x"], large)
    assert as_json.headers["content-type"] == "application/json"
    assert not as_json.url.params and orjson.loads(as_json.content)["model"] == "double"


def test_a_large_bare_array_goes_as_an_npy_body_and_every_input_counts_toward_the_size() -> None:
    server = Recorder(accept_one)
    rows = rows_of(BINARY_BODY_MIN_BYTES)
    pair = {"a": rows[:, :3], "b": rows[:, :2].astype(np.int32)}  # 3/4 and 1/2 of the threshold
    with server.client() as client:
        client.submit("double", rows_of(BINARY_BODY_MIN_BYTES))
        client.submit("pair", pair)

    bare, named = server.requests
    assert bare.headers["content-type"] == tensors.NPY
    np.testing.assert_array_equal(np.load(io.BytesIO(bare.content)), rows_of(BINARY_BODY_MIN_BYTES))
    assert named.headers["content-type"] == tensors.NPZ
    assert sorted(tensors.read_npz(named.content)) == ["a", "b"]


@pytest.mark.parametrize(
    "inputs",
    [
        {"x": rows_of(BINARY_BODY_MIN_BYTES).tolist()},
        {"x": rows_of(BINARY_BODY_MIN_BYTES), "y": [[1.0]]},
        np.array([b"a" * BINARY_BODY_MIN_BYTES], dtype=object),
        np.array(["a" * BINARY_BODY_MIN_BYTES]),
        rows_of(BINARY_BODY_MIN_BYTES).astype(np.complex64),
    ],
    ids=["lists", "mixed", "bytes", "str", "complex"],
)
def test_lists_strings_and_other_dtypes_stay_json_however_large(inputs: Any) -> None:
    server = Recorder(accept_one)
    with server.client() as client:
        client.submit("double", inputs)

    assert server.requests[0].headers["content-type"] == "application/json"


def test_a_binary_submit_is_sent_again_with_the_same_body_and_key() -> None:
    server = flaky([httpx.ReadError("reset"), 503], httpx.Response(202, json=wire_job()))
    with server.client(retries=Retries(attempts=3, backoff_s=0)) as client:
        client.submit("double", rows_of(BINARY_BODY_MIN_BYTES))

    assert len(server.requests) == 3
    assert len({(r.headers["idempotency-key"], r.content) for r in server.requests}) == 1


def test_an_api_that_refuses_binary_bodies_gets_the_job_again_as_json() -> None:
    def older_api(request: httpx.Request) -> httpx.Response:
        if request.headers["content-type"] != "application/json":
            return error_response(415, "unsupported_media_type", "Content-Type must be JSON")
        y = {"y": tensors.encode(np.ones((1, 4), np.float32), encoding="b64")}
        return httpx.Response(202, json=wire_job(status="succeeded", outputs=y))

    server = Recorder(older_api)
    x = rows_of(BINARY_BODY_MIN_BYTES)
    with server.client() as client:
        client.submit("double", {"x": x}, priority=2, idempotency_key="k-9")
        client.run("double", x)

    types = [r.headers["content-type"] for r in server.requests]
    assert types == [tensors.NPZ, "application/json", tensors.NPY, "application/json"]
    binary, as_json = server.requests[:2]
    assert binary.headers["idempotency-key"] == as_json.headers["idempotency-key"] == "k-9"
    assert orjson.loads(as_json.content)["priority"] == 2 and not as_json.url.params
    assert dict(server.requests[3].url.params) == {"wait": "30.000", "encoding": "b64"}


def test_reads_of_one_job_ask_for_npz_and_read_either_answer() -> None:
    y = samples(3) * 2
    answers = iter(
        [
            httpx.Response(200, json=wire_job(status="running")),  # not succeeded: JSON
            npz_answer(wire_job(status="succeeded"), {"y": y, "argmax": np.arange(3)}),
            httpx.Response(200, json=wire_job(status="succeeded")),  # a server without .npz
        ]
    )
    server = Recorder(lambda _: next(answers))
    with server.client() as client:
        done = client.wait("j1")
        as_lists = client.get("j1", encoding="json")

    assert done.ok and done.outputs is not None
    np.testing.assert_array_equal(done.outputs["y"], y)
    assert done.outputs["y"].flags.writeable and done.outputs["argmax"].dtype == np.int64
    done.outputs["y"] += 1  # the caller's own arrays
    assert as_lists.ok and as_lists.outputs is None
    accepts = [r.headers.get("accept") for r in server.requests]
    assert accepts == [ACCEPT_NPZ, ACCEPT_NPZ, "*/*"]  # httpx's default when none is asked


def test_run_submits_large_inputs_in_binary_and_reads_the_outputs_from_npz() -> None:
    x = rows_of(BINARY_BODY_MIN_BYTES)
    server = Recorder(lambda _: npz_answer(wire_job(status="succeeded"), {"y": x * 2}))
    with server.client() as client:
        outputs = client.run("double", x)

    np.testing.assert_array_equal(outputs["y"], x * 2)
    [request] = server.requests
    assert request.headers["content-type"] == tensors.NPY
    assert request.headers["accept"] == ACCEPT_NPZ
    assert dict(request.url.params) == {"model": "double", "wait": "30.000", "encoding": "b64"}


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, content=b"not a zip", headers={"Content-Type": tensors.NPZ}),
        httpx.Response(200, content=tensors.write_npz({}), headers={"Content-Type": tensors.NPZ}),
        httpx.Response(
            200,
            content=tensors.write_npz({}),
            headers={"Content-Type": tensors.NPZ, "Tffleet-Job": "[1, 2]"},
        ),
    ],
    ids=["junk", "no-job-header", "not-a-job"],
)
def test_an_npz_answer_that_is_not_a_jobs_raises_protocol_error(response: httpx.Response) -> None:
    with Recorder(lambda _: response).client() as client, pytest.raises(ProtocolError):
        client.get("j1")


def test_a_queued_job_shows_its_queue_position_and_eta() -> None:
    queued = ClientJob.from_wire(wire_job(queue_position=41, eta_s=12.5))
    running = ClientJob.from_wire(wire_job(status="running", queue_position=None, eta_s=None))
    before = ClientJob.from_wire(wire_job())  # an API older than both fields

    assert (queued.queue_position, queued.eta_s) == (41, 12.5)
    assert (running.queue_position, running.eta_s) == (None, None)
    assert (before.queue_position, before.eta_s) == (None, None)
    assert {k: queued.to_dict()[k] for k in ("queue_position", "eta_s")} == {
        "queue_position": 41,
        "eta_s": 12.5,
    }


def test_a_job_shows_a_split_jobs_progress_and_whether_the_cache_answered_it() -> None:
    split = ClientJob.from_wire(
        wire_job(status="running", progress={"samples_done": 256, "samples": 8192})
    )
    cached = ClientJob.from_wire(wire_job(status="succeeded", cached=True))
    before = ClientJob.from_wire(wire_job())  # an API older than both fields

    assert (split.progress, split.cached) == ((256, 8192), False)
    assert (cached.progress, cached.cached) == (None, True)
    assert (before.progress, before.cached) == (None, False)
    assert split.to_dict()["progress"] == {"samples_done": 256, "samples": 8192}
