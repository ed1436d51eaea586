"""Fixtures for real services: a private PostgreSQL database, a SQLite file and a Redis database.

A missing service skips its tests on a laptop but fails them under CI=true.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade

POSTGRES_URL = os.environ.get(
    "TFFLEET_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
# A Redis database per test run (1 to 15, by process id), so two runs on one machine rarely share
# queues, locks and channels; the fixture flushes it before and after each test.
REDIS_URL = os.environ.get(
    "TFFLEET_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{1 + os.getpid() % 15}"
)
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


@pytest.fixture
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        service_missing("Redis", exc)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()
