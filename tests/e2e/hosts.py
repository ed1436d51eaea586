"""Hosts of their own for end-to-end tests: each with its own network address and host name.

As root with `ip` and `unshare` (always under CI=true), every host is a Linux network namespace:

    test process (root namespace)
      ├─ bridge tfb<tag>, 10.231.N.1/24 (N picked free at random)
      │    ├─ Redis of the cluster's own, on 10.231.N.1, with a password
      │    └─ a TCP forwarder 10.231.N.1:<port> -> 127.0.0.1:5432 (PostgreSQL listens on loopback)
      └─ veth pairs to namespaces tffleet-<pid>-<tag>-<host>, one per host, at 10.231.N.2, .3, …

Each host's processes run as `ip netns exec <ns> unshare --uts sh -c 'hostname <host> && exec …'`
in a process group of their own: they reach Redis and PostgreSQL over TCP on the bridge only, and
`socket.gethostname()` (the host part of a worker's lease owner and presence rows) is the host's
name. Killing a host is `os.killpg` on each of its groups.

Elsewhere (not root, or no `ip`) hosts are process groups on 127.0.0.1 that reach PostgreSQL
and the cluster's Redis there; each gets its own host name where `unshare --user
--map-root-user --uts` works ("local"), else they share this machine's name ("shared") and
`Cluster.host_of` tells them apart by process group. TFFLEET_TEST_HOSTS=local|shared picks a
fallback on purpose (never under CI=true: there the namespaces must run).

Names carry a random tag and the test process's pid: parallel runs never collide, and a run that
was killed outright leaves namespaces (and a Redis on its bridge) that the next run removes
(`reap_stale`), processes and all. Everything else is removed by `open_cluster` on the way out,
whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from db import tenants
from db.engine import make_engine, make_sessionmaker
from db.models import DEFAULT_TENANT
from tests.conftest import IN_CI, POSTGRES_URL, service_missing
from tests.services import PrivateRedis

REPO = Path(__file__).resolve().parents[2]
NETNS_PREFIX = "tffleet-"
BRIDGE_PREFIX = "tfb"  # + 6 hex: interface names are at most 15 characters
SUBNET_FIRST_OCTETS = "10.231"
API_PORT = 8000  # a host of its own has every port free

LIBFAKETIME_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def libfaketime() -> str | None:
    """The libfaketime library (apt package `faketime`), if installed."""
    return next((path for path in LIBFAKETIME_PATHS if Path(path).exists()), None)


# libfaketime 0.9.10 (Debian 12) with FAKETIME_DONT_FAKE_MONOTONIC=1 fails
# clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...) with EINVAL, which is how Python's
# time.sleep sleeps: on a skewed host every time.sleep would raise OSError (Celery's timer thread
# dies of it). This module, first on that host's PYTHONPATH, makes time.sleep wait in select()
# instead, only where the probe shows it broken. Waits on locks, conditions and selectors work.
SLEEP_SHIM = """\
import select
import time


def _probe():
    try:
        time.sleep(0.0001)
    except OSError:
        return False
    return True


if not _probe():

    def sleep(secs):
        secs = float(secs)
        if secs < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = time.monotonic() + secs
        while (left := deadline - time.monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = sleep
"""


def skewed_clock_env(offset: str) -> dict[str, str]:
    """The environment that runs a process `offset` off the wall clock ("-5m", "+5m"): its
    realtime clock only; its monotonic clock stays true, as on a host whose clock is wrong
    (see SLEEP_SHIM, which `Cluster.add_host` adds for Python)."""
    library = libfaketime()
    if library is None:
        service_missing("libfaketime (apt package faketime)", FileNotFoundError())
    return {
        "LD_PRELOAD": str(library),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


# ─── Namespaces ───────────────────────────────────────────────────────────────────────────────────


def netns_available() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("unshare"))


def _ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in a namespace, then delete it (its veth ends go with it)."""
    for _ in range(50):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    _ip("netns", "delete", ns, check=False)


def reap_stale() -> None:
    """Remove the namespaces and bridges of runs whose test process is gone."""
    for line in _ip("netns", "list", check=False).splitlines():
        ns = line.split()[0] if line.split() else ""
        found = re.fullmatch(rf"{NETNS_PREFIX}(\d+)-\w+-.+", ns)
        if found and not _pid_alive(int(found.group(1))):
            _kill_namespace(ns)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).splitlines():
        found = re.search(
            rf"^\d+: ({BRIDGE_PREFIX}[0-9a-f]{{6}})[:@].*alias tffleet pid=(\d+)", line
        )
        if found and not _pid_alive(int(found.group(2))):
            bridge = found.group(1)
            addresses = re.findall(r"inet (\S+)/", _ip("-o", "-4", "addr", "show", "dev", bridge))
            for address in addresses:
                _kill_redis_on(address)
            _ip("link", "delete", bridge, check=False)


def _kill_redis_on(address: str) -> None:
    """SIGKILL the Redis servers listening on `address` (a dead run's Redis)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "redis-server" in title and f" {address}:" in title:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


@dataclass
class Bridge:
    """A bridge in the root namespace, and a namespace per host joined to it by a veth pair."""

    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    prefix: str = ""  # "10.231.N"
    namespaces: list[str] = field(default_factory=list)
    created: bool = False

    @property
    def name(self) -> str:
        return f"{BRIDGE_PREFIX}{self.tag}"

    @property
    def gateway(self) -> str:
        return f"{self.prefix}.1"

    def create(self) -> None:
        reap_stale()
        taken = _ip("-4", "-o", "addr", "show") + _ip("-4", "route", "show")
        free = [
            n for n in range(1, 255) if f"{SUBNET_FIRST_OCTETS}.{n}." not in taken.replace("/", ".")
        ]
        if not free:
            raise RuntimeError(f"no free {SUBNET_FIRST_OCTETS}.N.0/24 subnet here")
        self.prefix = f"{SUBNET_FIRST_OCTETS}.{random.choice(free)}"
        _ip("link", "add", self.name, "type", "bridge")
        self.created = True
        _ip("link", "set", "dev", self.name, "alias", f"tffleet pid={os.getpid()}")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.name)
        _ip("link", "set", self.name, "up")

    def add_namespace(self, host: str) -> tuple[str, str]:
        """A namespace for `host`: (its name, its address)."""
        index = len(self.namespaces) + 2
        if index > 254:
            raise RuntimeError("too many hosts for one /24")
        ns = f"{NETNS_PREFIX}{os.getpid()}-{self.tag}-{host}"
        outside, inside = f"tfv{self.tag}{index:02x}", f"tfp{self.tag}{index:02x}"
        address = f"{self.prefix}.{index}"
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        try:
            _ip("link", "set", inside, "netns", ns)
        except RuntimeError:
            _ip("link", "delete", outside, check=False)
            raise
        _ip("link", "set", outside, "master", self.name)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inside)
        _ip("-n", ns, "link", "set", inside, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.gateway)
        return ns, address

    def destroy(self) -> None:
        for ns in reversed(self.namespaces):
            _kill_namespace(ns)
        self.namespaces.clear()
        if self.created:
            _ip("link", "delete", self.name, check=False)
            self.created = False


def _userns_uts_works() -> bool:
    """Whether this (unprivileged) user can give a process a host name of its own."""
    if not shutil.which("unshare"):
        return False
    try:
        result = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--uts", "sh", "-c",
             "hostname tffleet-probe && hostname"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and result.stdout.strip() == "tffleet-probe"


# ─── Services on the bridge ───────────────────────────────────────────────────────────────────────


class TcpForwarder:
    """Accepts TCP connections on (host, an ephemeral port) and pipes each one to `target`.

    An asyncio loop on a thread of the test process: PostgreSQL listens on loopback only, and
    hosts in other namespaces must reach it over TCP.
    """

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.host = host
        self.target = target
        self.port = 0
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> int:
        self._thread = threading.Thread(target=self._run, name="tcp-forwarder", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"forwarder on {self.host}: {self._error}") from self._error
        if not self.port:
            raise RuntimeError(f"forwarder on {self.host} did not start")
        return self.port

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone already
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start(), or lost at shutdown
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await self._pipe_both(reader, writer)
            except asyncio.CancelledError:
                pass  # stopped: a cancelled handler would be logged as an error by asyncio
            finally:
                handlers.discard(task)

        server = await asyncio.start_server(accepted, self.host, 0, backlog=512)
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(handlers):
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await server.wait_closed()

    async def _pipe_both(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        writers = [client_w]
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
            writers.append(upstream_w)
            pipes = [
                asyncio.create_task(self._pipe(client_r, upstream_w)),
                asyncio.create_task(self._pipe(upstream_r, client_w)),
            ]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        except OSError:
            pass
        finally:
            for writer in writers:
                writer.close()
            for writer in writers:
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await writer.wait_closed()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()


def _free_port_on(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def fresh_database(server_url: str = POSTGRES_URL) -> Iterator[str]:
    """An empty database of its own on the test server, or `server_url`'s (no schema: `tffleet
    migrate` makes it), dropped on the way out. The URL is the test process's, on loopback."""
    # Pre-ping: a server restarted meanwhile (bench/chaos) has cut the pooled connection.
    admin = make_engine(server_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    name = f"tffleet_hosts_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # any driver error means "no server here"
        admin.dispose()
        service_missing("PostgreSQL", exc)
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# ─── Hosts ────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Host:
    """One machine of the fleet: an address, a host name, and the process groups it runs."""

    name: str
    address: str
    logs: Path
    netns: str | None = None
    own_hostname: bool = True  # False: it shares this machine's name (see `Cluster.host_of`)
    env: dict[str, str] = field(default_factory=dict)  # for every process of this host
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    child_pids: set[int] = field(default_factory=set)  # worker children seen in presence rows
    python_path: list[str] = field(default_factory=list)  # first on its PYTHONPATH
    killed: bool = False

    @property
    def identity(self) -> str:
        """What `socket.gethostname()` answers on this host."""
        return self.name if self.own_hostname else socket.gethostname()

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` as run on this host."""
        if not self.own_hostname:
            return argv
        script = f"hostname {shlex.quote(self.name)} && exec {shlex.join(argv)}"
        if self.netns is not None:
            return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", script]
        return ["unshare", "--user", "--map-root-user", "--uts", "sh", "-c", script]

    def popen(self, name: str, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start `argv` on this host in a process group of its own, logging to <host>-<name>.log."""
        with self.log_path(name).open("ab") as log:
            proc = subprocess.Popen(
                self.wrap(argv),
                env={**env, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=REPO,
            )
        self.procs[name] = proc
        return proc

    def run(
        self, argv: list[str], env: Mapping[str, str], *, timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on this host to its end."""
        return subprocess.run(
            self.wrap(argv),
            env={**env, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
        )

    def log_path(self, name: str) -> Path:
        return self.logs / f"{self.name}-{name}.log"

    def log(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def signal(self, sig: int) -> None:
        """Send `sig` to every process group of this host."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)

    def kill(self) -> None:
        """The host dies whole: SIGKILL to each of its process groups, nothing said to anyone."""
        self.killed = True
        self.signal(signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(timeout=30)

    def owns(self, pid: int) -> bool:
        """Whether `pid` runs (or ran, as a worker child seen earlier) on this host."""
        if pid in self.child_pids:
            return True
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return False
        return any(proc.pid == group for proc in self.procs.values())


@dataclass
class Cluster:
    """Hosts sharing one PostgreSQL database and one Redis, over TCP, and nothing else."""

    root: Path
    models: Path
    database_url: str  # the test process's view: PostgreSQL on loopback
    hosts_database_url: str  # the hosts' view
    redis: PrivateRedis
    mode: str  # see hosts_mode
    bridge: Bridge | None = None
    forwarder: TcpForwarder | None = None  # the hosts' way to PostgreSQL, with a bridge
    own_hostnames: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)  # TFFLEET_* for every process
    hosts: dict[str, Host] = field(default_factory=dict)
    api: Host | None = None
    api_port: int = API_PORT
    api_key: str = ""
    migrated: bool = False

    # Hosts

    def add_host(
        self, name: str, *, clock: str | None = None, env: Mapping[str, str] | None = None
    ) -> Host:
        """A new host; with `clock` ("-5m", "+5m"), its wall clock is that far off."""
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,20}", name) or name in self.hosts:
            raise ValueError(f"bad or repeated host name {name!r}")
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        own_env = dict(env or {})
        python_path: list[str] = []
        if clock is not None:
            own_env.update(skewed_clock_env(clock))
            shim = self.root / f"sleep-shim-{name}"
            shim.mkdir()
            (shim / "sitecustomize.py").write_text(SLEEP_SHIM)
            python_path.append(str(shim))
        if self.bridge is not None:
            ns, address = self.bridge.add_namespace(name)
            host = Host(name, address, logs, netns=ns, env=own_env)
        else:
            host = Host(name, "127.0.0.1", logs, own_hostname=self.own_hostnames, env=own_env)
        host.python_path = python_path
        self.hosts[name] = host
        return host

    def env(self, host: Host) -> dict[str, str]:
        local = self.bridge is None
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*host.python_path, str(REPO)]),
            "TFFLEET_DATABASE_URL": self.hosts_database_url,
            "TFFLEET_BROKER_URL": self.redis.url,
            "TFFLEET_MODEL_REPOSITORY": str(self.models),
            "TFFLEET_API_HOST": host.address,
            "TFFLEET_API_PORT": str(self.api_port),
            # Hosts on one address must not share a port.
            "TFFLEET_WORKER_METRICS_PORT": "0" if local else "9809",
            "TFFLEET_MAX_QUEUE_DELAY_MS": "2",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            **self.extra_env,
        }

    def tffleet(self, host: Host, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        """Start `tffleet <args>` on `host`."""
        return host.popen(
            name, [sys.executable, "-m", "tffleet.cli", *args], {**self.env(host), **env}
        )

    def python(self, host: Host, code: str) -> str:
        """Run Python code on `host`; its stdout."""
        result = host.run([sys.executable, "-c", code], self.env(host), timeout_s=60)
        if result.returncode != 0:
            raise RuntimeError(f"python on {host.name}: {result.stdout}{result.stderr}")
        return result.stdout

    def migrate(self, host: Host) -> None:
        """`tffleet migrate` from `host`, through the bridge: the schema, and the TCP path."""
        result = host.run([sys.executable, "-m", "tffleet.cli", "migrate"], self.env(host))
        if result.returncode != 0:
            pytest.fail(f"tffleet migrate on {host.name} failed:\n{result.stdout}{result.stderr}")

    def hostname_on(self, host: Host) -> str:
        return self.python(host, "import socket; print(socket.gethostname())").strip()

    # The fleet's processes

    @property
    def url(self) -> str:
        assert self.api is not None, "start_api first"
        return f"http://{self.api.address}:{self.api_port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, trust_env=False, **kwargs)

    def ahttp(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, trust_env=False, **kwargs)

    def start_api(self, host: Host, *, wait: bool = True) -> None:
        """`tffleet migrate`, then `tffleet api`, on `host`; an admin key for the test.
        `wait=False` returns once it is started (the schema made): then `wait_api`."""
        if not self.migrated:
            self.migrate(host)
            self.migrated = True
        if not self.api_key:
            engine = make_engine(self.database_url)
            with make_sessionmaker(engine).begin() as session:
                self.api_key = tenants.create_key(
                    session=session, tenant=DEFAULT_TENANT, admin=True
                ).key
            engine.dispose()
        self.api = host
        self.tffleet(host, "api", "api")
        if wait:
            self.wait_api()

    def wait_api(self) -> None:
        def ready() -> bool:
            with self.http(timeout=5) as client:
                return client.get("/readyz").status_code == 200

        assert self.api is not None
        self.wait_until(ready, f"the API on {self.api.name} ({self.url}) ready")

    def start_worker(self, host: Host, devices: str) -> None:
        """`tffleet worker` on `host`; see `wait_workers` for when its children serve."""
        self.tffleet(host, "worker", "worker", "--log-level", "INFO", TFFLEET_DEVICES=devices)

    def start_sweeper(self, host: Host) -> None:
        self.tffleet(host, "sweeper", "sweeper")
        self.wait_until(
            lambda: "active sweeper" in host.log("sweeper"), f"the sweeper on {host.name} active"
        )

    def presence(self, host: Host | None = None) -> list[Any]:
        """Presence rows (of `host`'s children), with `age_s` by the database's clock."""
        engine = make_engine(self.database_url)
        try:
            with engine.connect() as conn:
                rows = list(
                    conn.execute(
                        text(
                            "SELECT child, host, pid, device, name, version, state, seen_at, "
                            "EXTRACT(EPOCH FROM (clock_timestamp() AT TIME ZONE 'UTC') - seen_at) "
                            "AS age_s FROM model_presence ORDER BY child"
                        )
                    )
                )
        finally:
            engine.dispose()
        if host is None:
            return rows
        return [row for row in rows if self._row_on(row, host)]

    def _row_on(self, row: Any, host: Host) -> bool:
        if self.own_hostnames:
            return bool(row.host == host.identity)
        return host.owns(int(row.pid))

    def wait_workers(self, host: Host, children: int, *, timeout_s: float = 180) -> list[Any]:
        """Wait until `children` worker children of `host` report a loaded model (a presence row
        in the database, whatever its time); returns those rows."""
        found: list[Any] = []

        def loaded() -> bool:
            nonlocal found
            found = [row for row in self.presence(host) if row.state == "loaded"]
            return len({row.child for row in found}) >= children

        self.wait_until(loaded, f"{children} worker children on {host.name} loaded", timeout_s)
        host.child_pids.update(int(row.pid) for row in found)
        return found

    def host_of(self, worker: str | None) -> str | None:
        """The host that ran a job, from its `worker` (the lease owner: host/pid/device/id)."""
        if not worker:
            return None
        hostname, pid = worker.split("/")[:2]
        for host in self.hosts.values():
            if self.own_hostnames and hostname == host.identity:
                return host.name
            if not self.own_hostnames and host.owns(int(pid)):
                return host.name
        return None

    def wait_until(self, check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        """Poll `check`; fail at once if a process of a live host exits meanwhile."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for host in self.hosts.values():
                for name, proc in host.procs.items():
                    if not host.killed and proc.poll() is not None:
                        pytest.fail(
                            f"{name} on {host.name} exited ({proc.returncode}) waiting for "
                            f"{what}:\n{host.log(name)[-4000:]}"
                        )
            try:
                if check():
                    return
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.2)
        pytest.fail(f"timed out after {timeout_s}s waiting for {what}\n{self.logs_tail()}")

    def logs_tail(self, chars: int = 2500) -> str:
        return "\n".join(
            f"--- {host.name} {name}\n{host.log(name)[-chars:]}"
            for host in self.hosts.values()
            for name in host.procs
        )

    def close(self) -> None:
        """SIGKILL to every host: a test that checks how a process stops stops it itself, and
        SIGTERM here waited for each host's warm shutdown in turn."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.kill()


def hosts_mode() -> str:
    """How hosts are made here: "netns" (root with `ip` and `unshare`; always under CI=true),
    else "local" (process groups on 127.0.0.1 with host names of their own, in user namespaces)
    or "shared" (process groups sharing this machine's name). TFFLEET_TEST_HOSTS=local or
    shared picks one outside CI, to try the fallbacks."""
    wanted = os.environ.get("TFFLEET_TEST_HOSTS", "auto")
    if wanted not in ("auto", "netns", "local", "shared"):
        raise ValueError(f"TFFLEET_TEST_HOSTS={wanted!r}: auto, netns, local or shared")
    if IN_CI or wanted in ("auto", "netns"):
        if netns_available():
            return "netns"
        if IN_CI or wanted == "netns":
            pytest.fail(
                "the multi-host tests must run in network namespaces here: run as root with "
                "`ip` (iproute2) and `unshare` (util-linux)",
                pytrace=False,
            )
    if wanted != "shared" and _userns_uts_works():
        return "local"
    return "shared"


@contextlib.contextmanager
def open_cluster(
    root: Path,
    models: Path,
    *,
    env: Mapping[str, str] | None = None,
    postgres_url: str = POSTGRES_URL,
) -> Iterator[Cluster]:
    """A cluster with no hosts yet (`add_host`), a fresh database with the schema made by
    `tffleet migrate` from a host of its own, and a Redis of its own. Everything it made is gone
    on the way out: processes, namespaces, bridge, forwarder, Redis, database."""
    mode = hosts_mode()
    use_netns = mode == "netns"
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(fresh_database(postgres_url))
        bridge: Bridge | None = None
        forwarder: TcpForwarder | None = None
        if use_netns:
            bridge = Bridge()
            stack.callback(bridge.destroy)  # last out: after every process is gone
            bridge.create()
            server_url = make_url(database_url)
            forwarder = TcpForwarder(
                bridge.gateway, (server_url.host or "127.0.0.1", server_url.port or 5432)
            )
            port = forwarder.start()
            stack.callback(forwarder.stop)
            hosts_database_url = (
                make_url(database_url)
                .set(host=bridge.gateway, port=port)
                .render_as_string(hide_password=False)
            )
            redis_address = bridge.gateway
        else:
            hosts_database_url = database_url
            redis_address = "127.0.0.1"
        server = PrivateRedis(
            root / "redis",
            port=_free_port_on(redis_address),
            address=redis_address,
            password=secrets.token_hex(12),
        )
        server.start()
        stack.callback(server.kill)
        cluster = Cluster(
            root=root,
            models=models,
            database_url=database_url,
            hosts_database_url=hosts_database_url,
            redis=server,
            mode=mode,
            bridge=bridge,
            forwarder=forwarder,
            own_hostnames=mode != "shared",
            extra_env=dict(env or {}),
            api_port=API_PORT if use_netns else _free_port_on("127.0.0.1"),
        )
        stack.callback(cluster.close)
        yield cluster


# ─── Jobs ─────────────────────────────────────────────────────────────────────────────────────────


class JobsTable:
    """The test's view of the `jobs` table, on loopback (not through the bridge)."""

    COLUMNS = (
        "id, status, error_code, attempts, worker, lease_expires_at, outputs, created_at, "
        "started_at, finished_at"
    )

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url, pool_pre_ping=True)

    def close(self) -> None:
        self.engine.dispose()

    def rows(self, where: str = "TRUE", **params: Any) -> dict[str, Any]:
        """Rows by id; datetimes naive UTC, as stored."""
        with self.engine.connect() as conn:
            query = text(f"SELECT {self.COLUMNS} FROM jobs WHERE {where}")
            return {row.id: row for row in conn.execute(query, params)}

    def count(self, status: str) -> int:
        with self.engine.connect() as conn:
            query = text("SELECT count(*) FROM jobs WHERE status = :s")
            return int(conn.scalar(query, {"s": status}) or 0)

    def now(self) -> datetime:
        """The database's clock, naive UTC (as the rows' datetimes)."""
        with self.engine.connect() as conn:
            now: datetime = conn.scalar(text("SELECT clock_timestamp() AT TIME ZONE 'UTC'"))
            return now

    def drain(self, ids: list[str], *, timeout_s: float) -> dict[str, Any]:
        """Wait until every one of `ids` has ended; fail naming those that did not."""
        final = ("succeeded", "failed", "canceled")
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.rows()
            stuck = {
                i: (rows[i].status, rows[i].attempts)
                for i in ids
                if i in rows and rows[i].status not in final
            }
            missing = [i for i in ids if i not in rows]
            if not stuck and not missing:
                return rows
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{len(stuck)} jobs did not end within {timeout_s}s ({len(missing)} missing): "
                    f"{dict(list(stuck.items())[:20])}"
                )
            time.sleep(0.25)
