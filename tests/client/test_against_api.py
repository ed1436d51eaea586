"""The Python client against the real API: the async client against the app in-process (lifespan
included, SQLite and a real Redis), the blocking client against `tffleet api` in a subprocess.
No worker runs: `FakeWorker` (tests/client/fleet.py) plays one through `db.jobs` and announces on
the completion channel.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import numpy as np
import orjson
import pytest

from api.app import create_app
from db import jobs
from db.engine import make_engine, make_sessionmaker
from tests.client.fleet import (
    NO_WAIT,
    SIGNATURES,
    FakeWorker,
    Served,
    register_models,
    samples,
)
from tffleet import (
    AsyncClient,
    Client,
    Conflict,
    ConnectError,
    InvalidInput,
    JobCanceled,
    JobFailed,
    NotFound,
    WaitTimeout,
    tensors,
)
from tffleet.cli.process_group import free_port
from tffleet.client import job as job_module
from tffleet.client.job import BINARY_BODY_MIN_BYTES
from tffleet.settings import Settings

# The async client against the app in-process


class Recording(httpx.AsyncBaseTransport):
    """Records requests; loses the next `lose_answers` answers after the app has handled them."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[httpx.Request] = []
        self.answered: list[str] = []  # each answer's Content-Type
        self.lose_answers = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = await self.inner.handle_async_request(request)
        self.answered.append(response.headers.get("content-type", ""))
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
async def api(sqlite_url: str, redis_url: str) -> AsyncIterator[InProcess]:
    api_key = register_models(sqlite_url)
    # Its arrays (64 KiB and less) stay inline, as the fake worker reads them: the object store's
    # way is tests/client/test_objects.py's.
    settings = Settings(database_url=sqlite_url, broker_url=redis_url, inline_max_bytes=1 << 18)
    app = create_app(settings)
    worker = FakeWorker(sqlite_url, redis_url)
    try:
        async with app.router.lifespan_context(app):
            transport = Recording(httpx.ASGITransport(app=app))
            async with AsyncClient(
                "http://tffleet", api_key=api_key, transport=transport
            ) as client:
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
        await api.client.submit("double", samples(2).astype(np.int64))
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


# Large arrays: a binary body out, an .npz answer back


def large(rows: int = BINARY_BODY_MIN_BYTES // 16) -> np.ndarray:
    """Samples of the `double` model: BINARY_BODY_MIN_BYTES of them by default."""
    return samples(rows)


def stored(database_url: str, job_id: str) -> dict[str, np.ndarray]:
    """A job's inputs as the API stored them."""
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return tensors.unpack(jobs.get(session=session, job_id=job_id).inputs)
    finally:
        engine.dispose()


@pytest.mark.anyio
async def test_large_arrays_go_in_binary_and_their_outputs_come_back_from_an_npz(
    api: InProcess, sqlite_url: str
) -> None:
    x = large()
    job = await api.client.submit("double", {"x": x}, priority=3)
    bare = await api.client.submit("double", x + 1)
    assert [r.headers["content-type"] for r in api.transport.requests] == [
        tensors.NPZ,
        tensors.NPY,
    ]
    assert job.priority == 3 and job.status == bare.status == "queued"
    np.testing.assert_array_equal(stored(sqlite_url, job.id)["x"], x)  # bit for bit
    np.testing.assert_array_equal(stored(sqlite_url, bare.id)["x"], x + 1)

    api.worker.serve("double")
    done = await api.client.wait(job.id, timeout=20)
    assert api.transport.answered[-1] == tensors.NPZ
    assert done.ok and done.outputs is not None and done.worker == "fake"
    np.testing.assert_array_equal(done.outputs["y"], x * 2)
    assert done.outputs["argmax"].dtype == np.int64 and done.outputs["y"].flags.writeable
    again = await api.client.get(bare.id)
    assert again.outputs is not None
    np.testing.assert_array_equal(again.outputs["y"], (x + 1) * 2)


@pytest.mark.anyio
async def test_run_of_large_inputs_is_one_binary_round_trip(api: InProcess) -> None:
    api.worker.serve("pair")
    a = large()[:, :3]
    b = np.ones((len(a), 2), np.int32)

    outputs = await api.client.run("pair", {"a": a, "b": b}, timeout=20)

    np.testing.assert_allclose(outputs["total"], a.sum(axis=1) + 2, rtol=1e-6)
    assert [(r.method, r.url.path) for r in api.transport.requests] == [("POST", "/v1/jobs")]
    assert api.transport.requests[0].headers["content-type"] == tensors.NPZ
    assert api.transport.answered == [tensors.NPZ]


@pytest.mark.anyio
async def test_small_arrays_and_bulk_submits_stay_json(api: InProcess) -> None:
    await api.client.submit("double", large(BINARY_BODY_MIN_BYTES // 16 - 1))
    await api.client.submit_many("double", [large()] * 2)

    assert {r.headers["content-type"] for r in api.transport.requests} == {"application/json"}


@pytest.mark.anyio
async def test_float64_arrays_are_cast_to_a_float32_input_with_one_warning(
    api: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_module, "_float64_warned", False)
    rand = np.random.default_rng(0).random
    with pytest.warns(UserWarning, match="float64 array") as warned:
        small = await api.client.submit("double", rand((2, 4)))  # JSON, a b64 envelope
        big = await api.client.submit("double", {"x": rand((BINARY_BODY_MIN_BYTES // 32, 4))})
        bulk = await api.client.submit_many("double", [rand((1, 4))] * 3)
    assert len(warned) == 1  # once a process, not once a job
    api.worker.serve("double")
    for job in [small, big, *bulk]:
        done = await api.client.wait(job.id, timeout=20)
        assert done.ok and done.outputs is not None
        assert done.outputs["y"].dtype == np.float32
    # A value float32 cannot hold is refused, as it is in nested lists; nothing is stored.
    with pytest.raises(InvalidInput) as caught:
        await api.client.submit("double", np.full((1, 4), 1e39))
    assert caught.value.message == "inputs.x: float64 value out of range for dtype float32"


@pytest.mark.anyio
async def test_a_binary_submit_whose_answer_was_lost_is_stored_once(api: InProcess) -> None:
    api.transport.lose_answers = 1
    job = await api.client.submit("double", large())

    assert api.submits() == 2 and api.worker.queued("double") == [job.id]


@pytest.mark.anyio
async def test_large_inputs_that_do_not_fit_raise_invalid_input_naming_the_field(
    api: InProcess,
) -> None:
    with pytest.raises(InvalidInput) as caught:
        await api.client.submit("double", {"x": large().astype(np.int64)})
    assert caught.value.message == "inputs.x: expected dtype float32, got int64"
    with pytest.raises(InvalidInput, match=r"inputs.x: dimension 1 must be 4"):
        await api.client.submit("double", large().reshape(-1, 8))
    assert api.worker.queued("double") == []


# The blocking client against `tffleet api` in a subprocess


@pytest.mark.slow
def test_the_blocking_client_submits_waits_and_runs_against_a_served_api(
    served: Served, worker: FakeWorker
) -> None:
    worker.serve("double")
    x = samples(4)
    with Client(served.url, api_key=served.api_key) as client:
        job = client.submit("double", x)
        done = client.wait(job.id, timeout=20).raise_for_error()
        assert done.outputs is not None
        np.testing.assert_array_equal(done.outputs["y"], x * 2)
        np.testing.assert_array_equal(client.run("double", x[:1], timeout=20)["y"], x[:1] * 2)

        many = client.submit_many("double", [x[i : i + 1] for i in range(4)], chunk_size=3)
        finished = client.wait_all([j.id for j in many], timeout=20)
        assert [j.id for j in finished] == [j.id for j in many] and all(j.ok for j in finished)
        assert [j.status for j in client.get_many([many[1].id, job.id])] == ["succeeded"] * 2

        big = large(50_000)  # 800 kB: uploaded, then as an .npy body, through a real socket
        done = client.wait(client.submit("double", {"x": big}).id, timeout=20).raise_for_error()
        assert done.outputs is not None
        np.testing.assert_array_equal(done.outputs["y"], big * 2)
        np.testing.assert_array_equal(client.run("double", big, timeout=20)["y"], big * 2)


@pytest.mark.slow
def test_the_blocking_client_reports_an_api_that_is_not_there() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, retries=NO_WAIT) as client, pytest.raises(ConnectError) as caught:
        client.get("j1")
    assert f"GET {url}/v1/jobs/j1" in str(caught.value)
