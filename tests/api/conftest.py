"""The real app in-process (lifespan included) on a real database and a real Redis.

On SQLite (`db_url`); the tests of a path that differs by dialect (an insert that may conflict,
the reads of the console, standing and backlog) are marked `both_databases` and run on
PostgreSQL too. No worker runs: a test that needs a finished job plays the worker itself through
`db.jobs` (`finish_job`).

The client is httpx over ASGITransport with the lifespan entered by hand, not Starlette's
TestClient: Starlette 1.x warns when TestClient runs on `httpx`, and warnings are errors here.
The tests are async (anyio); the event loop runs only while a fixture or a test awaits, so the
app's background tasks (the completion channel's subscription) make progress only then.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api.app import create_app
from api.state import AppState
from db import jobs, registry, tenants
from db.models import DEFAULT_TENANT, Job, JobStatus, Upload
from tffleet import tensors
from tffleet.broker import Publisher, queue_lists
from tffleet.constants import JOBS_DONE_CHANNEL
from tffleet.objectstore import ObjectStore, open_store
from tffleet.settings import Settings

Sessions = sessionmaker[Session]

MAX_BODY_BYTES = 16 * 1024
DEAD_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")

# The fake fleet: name -> version -> (inputs, outputs).
SIGNATURES: dict[str, dict[int, tuple[dict[str, Any], dict[str, Any]]]] = {
    "mlp": {
        1: (
            {"x": {"dtype": "float32", "shape": [-1, 4]}},
            {"y": {"dtype": "float32", "shape": [-1, 2]}},
        ),
        2: (
            {"x": {"dtype": "float32", "shape": [-1, 4]}},
            {"y": {"dtype": "float32", "shape": [-1, 3]}},
        ),
    },
    "pair": {
        1: (
            {
                "a": {"dtype": "float32", "shape": [-1, 3]},
                "b": {"dtype": "float32", "shape": [-1, 2]},
            },
            {"sum": {"dtype": "float32", "shape": [-1]}},
        ),
    },
    "count": {
        1: (
            {"ids": {"dtype": "int32", "shape": [-1, -1]}},
            {"n": {"dtype": "int64", "shape": [-1]}},
        ),
    },
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def envelope(array: np.ndarray, **overrides: Any) -> dict[str, Any]:
    """The binary wire form of `array`, with any key replaced."""
    little = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<")))
    value: dict[str, Any] = {
        "b64": base64.b64encode(little.tobytes()).decode("ascii"),
        "dtype": array.dtype.name,
        "shape": list(array.shape),
    }
    value.update(overrides)
    return value


@pytest.fixture
def models(sessions: Sessions) -> dict[str, Any]:
    """Register the fake fleet's signatures, as a worker would on loading its models."""
    with sessions.begin() as session:
        for name, versions in SIGNATURES.items():
            for version, (inputs, outputs) in versions.items():
                registry.register(
                    session=session,
                    name=name,
                    version=version,
                    format="savedmodel",
                    inputs=inputs,
                    outputs=outputs,
                )
    return SIGNATURES


@pytest.fixture
def broker(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@dataclass
class Api:
    """A running app: an HTTP client to it (with an admin key of the `default` tenant) and the
    state its lifespan built."""

    client: httpx.AsyncClient
    state: AppState
    sessions: Sessions  # the test's database (the app's may be overridden, a dead one say)

    def key(self, tenant: str, *, admin: bool = False) -> dict[str, str]:
        """Headers with a new key of `tenant`, for `client.get(..., headers=...)`."""
        with self.sessions.begin() as session:
            made = tenants.create_key(session=session, tenant=tenant, admin=admin)
        return {"Authorization": f"Bearer {made.key}"}


OpenApi = Callable[..., AbstractAsyncContextManager[Api]]


@pytest.fixture
def open_api(
    db_url: str, redis_url: str, models: dict[str, Any], sessions: Sessions, tmp_path: Path
) -> OpenApi:
    """Start the app (running its lifespan) with test settings, overridable per call. Its object
    store is the test's (`object_store_url`, where the test asks for one), else a directory of
    its own."""

    @asynccontextmanager
    async def open_(**overrides: Any) -> AsyncIterator[Api]:
        values: dict[str, Any] = {
            "database_url": db_url,
            "broker_url": redis_url,
            "max_body_bytes": MAX_BODY_BYTES,
            "object_store": os.environ.get("TFFLEET_OBJECT_STORE")
            or (tmp_path / "objects").as_uri(),
        }
        values.update(overrides)
        app = create_app(Settings(**values))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://tffleet") as client:
                running = Api(client=client, state=app.state.tffleet, sessions=sessions)
                client.headers.update(running.key(DEFAULT_TENANT, admin=True))
                yield running

    return open_


@pytest.fixture
async def api(open_api: OpenApi) -> AsyncIterator[Api]:
    async with open_api() as running:
        yield running


@pytest.fixture
def client(api: Api) -> httpx.AsyncClient:
    return api.client


# What the database and the broker hold


def count_jobs(sessions: Sessions) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def count_uploads(sessions: Sessions) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Upload)) or 0)


@pytest.fixture
async def store_api(object_store: ObjectStore, open_api: OpenApi) -> AsyncIterator[Api]:
    """The app on the test's store (a directory, then S3)."""
    async with open_api() as running:
        yield running


def created_uri(response: httpx.Response) -> str:
    """The `uri` of a 201 from POST /v1/uploads."""
    assert response.status_code == 201, response.text
    uri: str = response.json()["uri"]
    return uri


def inputs_of(api: Api, job_id: str, store: ObjectStore) -> dict[str, np.ndarray]:
    """A job's inputs as a worker reads them: its blob, and the objects it references."""
    blob = read_job(api.sessions, job_id).inputs
    found = {ref.key: store.get(ref.key) for ref in tensors.references(blob).values()}
    return tensors.unpack(blob, found)


def read_job(sessions: Sessions, job_id: str) -> Job:
    with sessions() as session:
        job = jobs.get(session=session, job_id=job_id)
        _ = job.inputs, job.outputs  # deferred: load them before the session closes
        return job


def queued_messages(broker: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Celery messages waiting in a queue (Redis lists, one per priority), in delivery order."""
    found = []
    for name in queue_lists(queue):
        raw: list[bytes] = broker.lrange(name, 0, -1)  # type: ignore[assignment]
        found += [orjson.loads(item) for item in reversed(raw)]  # LPUSH: newest at the head
    return found


def task_args(message: Mapping[str, Any]) -> list[Any]:
    """The positional arguments of a Celery (protocol 2) message."""
    assert message["content-type"] == "application/json"
    assert message["properties"]["body_encoding"] == "base64"
    args, _kwargs, _embed = orjson.loads(base64.b64decode(message["body"]))
    return list(args)


def broker_lists(broker: redis.Redis) -> list[bytes]:
    """Every Redis list in the broker's database: a published message sits in one."""
    return [key for key in broker.scan_iter() if broker.type(key) == b"list"]


def assert_nothing_left(sessions: Sessions, broker: redis.Redis) -> None:
    """An error response never leaves a job behind, nor a wake-up."""
    assert count_jobs(sessions) == 0
    assert broker_lists(broker) == []


# Playing the worker


def finish_job(
    sessions: Sessions,
    job_id: str,
    outputs: Mapping[str, np.ndarray],
    *,
    announce_to: str | None = None,
) -> None:
    """Claim and complete a job as a worker would; announce it on the channel if asked."""
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="test-worker", lease_s=60)
    with sessions.begin() as session:
        assert jobs.complete(session=session, results=[(lease, tensors.pack(outputs))]) == 1
    if announce_to is not None:
        with redis.Redis.from_url(announce_to) as client:
            client.publish(JOBS_DONE_CHANNEL, orjson.dumps([job_id]))


@pytest.fixture
def finish_later(sessions: Sessions) -> Iterator[Callable[..., threading.Thread]]:
    """Finish a job from another thread after `delay_s` (and once `after` is set, when given),
    while a request waits on it."""
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start(
        job_id: str,
        outputs: Mapping[str, np.ndarray],
        *,
        delay_s: float,
        announce_to: str | None = None,
        after: threading.Event | None = None,
    ) -> threading.Thread:
        def run() -> None:
            try:
                if after is not None and not after.wait(timeout=30):
                    raise TimeoutError("the event to finish the job after never came")
                time.sleep(delay_s)
                if announce_to is not None:
                    _until_subscribed(announce_to)
                finish_job(sessions, job_id, outputs, announce_to=announce_to)
            except BaseException as exc:  # surfaced in the test's thread below
                errors.append(exc)

        thread = threading.Thread(target=run, name=f"finish-{job_id}", daemon=True)
        threads.append(thread)
        thread.start()
        return thread

    yield start
    for thread in threads:
        thread.join(timeout=10)
    if errors:
        raise errors[0]


def _until_subscribed(redis_url: str, timeout_s: float = 30.0) -> None:
    """The API subscribes in the background at startup: do not announce into the void."""
    deadline = time.monotonic() + timeout_s
    with redis.Redis.from_url(redis_url) as client:
        while time.monotonic() < deadline:
            counts = client.pubsub_numsub(JOBS_DONE_CHANNEL)
            if counts and counts[0][1] > 0:
                return
            time.sleep(0.01)
    raise AssertionError(f"nobody subscribed to {JOBS_DONE_CHANNEL} within {timeout_s} s")


@contextmanager
def fake_worker(
    sessions: Sessions,
    redis_url: str,
    compute: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    store: ObjectStore | None = None,
) -> Iterator[list[str]]:
    """Finishes each queued job with `compute(its inputs)`, announcing it as a worker does, the
    objects its inputs reference read from `store` as a worker reads them; yields the ids it
    finished."""
    done: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def run() -> None:
        try:
            _until_subscribed(redis_url)
            while not stop.is_set():
                with sessions() as session:
                    queued = session.scalars(
                        select(Job.id).where(Job.status == JobStatus.QUEUED.value)
                    ).all()
                for job_id in queued:
                    blob = read_job(sessions, job_id).inputs
                    references = tensors.references(blob).values()
                    found = {r.key: store.get(r.key) for r in references} if store else None
                    outputs = compute(tensors.unpack(blob, found))
                    finish_job(sessions, job_id, outputs, announce_to=redis_url)
                    done.append(job_id)
                time.sleep(0.01)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="fake-worker", daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(timeout=10)
    if errors:
        raise errors[0]


@dataclass
class Publication:
    model: str
    version: int
    job_ids: list[str]
    committed: bool  # every named row was visible to another connection when it was published


@pytest.fixture
def publications(monkeypatch: pytest.MonkeyPatch, sessions: Sessions) -> list[Publication]:
    """Record every publish the app makes, and whether its rows were committed by then."""
    seen: list[Publication] = []
    publish = Publisher.publish

    def checking(
        self: Publisher, *, model: str, version: int, job_ids: Sequence[str], **options: bool
    ) -> bool:
        with sessions() as session:
            found = jobs.get_many(session=session, job_ids=job_ids)
        seen.append(Publication(model, version, list(job_ids), len(found) == len(job_ids)))
        return publish(self, model=model, version=version, job_ids=job_ids, **options)

    monkeypatch.setattr(Publisher, "publish", checking)
    return seen


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A directory object store of the test's own, for an app opened with `object_store=`."""
    return (tmp_path / "objects").as_uri()


@pytest.fixture
def store(store_url: str) -> ObjectStore:
    return open_store(store_url)
