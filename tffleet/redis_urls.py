"""The broker's address (TFFLEET_BROKER_URL), read once for every Redis client of the fleet.

Celery's broker, the announcements, the reload channel, the sweeper's lock and the CLI all talk
to the same Redis; each makes its client here, so each reaches it the same way:

- `redis://[[user]:password@]host[:port][/db]`, `rediss://...` (TLS), `unix:///path?db=N`: one
  Redis, as redis-py reads these URLs.
- `sentinel://[[user]:password@]host:port;sentinel://host:port;.../db?master_name=NAME`: a Redis
  watched by Sentinel, in the form kombu's Redis transport takes (each sentinel a
  `sentinel://` part, `;` between them). The password is the master's (kombu's rule); the
  sentinels' own password, when they have one, is `sentinel_password=` beside `master_name=`.
  A client asks the sentinels where the master is and asks again once its connection fails, so
  it follows a promotion (`redis.sentinel.Sentinel.master_for`); Celery gets the same URL without
  the query and `broker_transport_options` `master_name` and `sentinel_kwargs`.

Redis Cluster is refused, by its URL (`redis+cluster://`, `rediss+cluster://`) in the settings
and, for a plain URL that reaches a cluster node, by `refuse_cluster` at each process's start:
Celery's Redis transport needs one keyspace (a worker's BRPOP spans its models' queues).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.connection import parse_url

log = logging.getLogger(__name__)

SENTINEL_PORT = 26379
CLUSTER_REFUSED = (
    "TFFLEET_BROKER_URL names a Redis Cluster, which the fleet cannot use: Celery's Redis "
    "transport needs a single Redis (a worker takes from all its models' queues at once, keys a "
    "cluster keeps on different nodes). Use one Redis, or Redis with Sentinel for fail-over "
    "(sentinel://host:26379;sentinel://host2:26379/0?master_name=NAME)"
)
_SENTINEL_OPTIONS = {"master_name", "sentinel_password"}


class BrokerUrlError(ValueError):
    """TFFLEET_BROKER_URL cannot be used; the message says why (and names the setting)."""


@dataclass(frozen=True)
class SentinelAddress:
    """A `sentinel://` broker URL, parsed."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None  # the master's (and its replicas')
    sentinel_password: str | None = None

    def celery_url(self) -> str:
        """The URL as kombu takes it: the sentinels, the master's credentials and the database
        on the first part (kombu reads only that one's), no query."""
        auth = ""
        if self.password is not None or self.username is not None:
            user = quote(self.username or "", safe="")
            auth = f"{user}:{quote(self.password or '', safe='')}@"
        return ";".join(
            f"sentinel://{auth}{_host(host)}:{port}/{self.db}" for host, port in self.sentinels
        )

    def transport_options(self, **socket_options: Any) -> dict[str, Any]:
        """Celery's `broker_transport_options` beside `celery_url()`; `socket_options` (its
        socket timeouts) also bound each call to a sentinel."""
        sentinel_kwargs: dict[str, Any] = dict(socket_options)
        if self.sentinel_password is not None:
            sentinel_kwargs["password"] = self.sentinel_password
        return {"master_name": self.master_name, "sentinel_kwargs": sentinel_kwargs}


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_broker_url(url: str) -> SentinelAddress | None:
    """A `sentinel://` URL's parts; None for a URL of one Redis, once checked. Raises
    BrokerUrlError naming TFFLEET_BROKER_URL for anything else (a cluster URL included)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis+cluster", "rediss+cluster") or "cluster" in scheme:
        raise BrokerUrlError(CLUSTER_REFUSED)
    if scheme == "sentinel":
        return _parse_sentinels(url)
    try:
        parse_url(url)
    except ValueError as exc:
        raise BrokerUrlError(
            f"TFFLEET_BROKER_URL={_masked(url)!r} is not a Redis URL ({exc}); "
            "use redis://, rediss://, unix:// or sentinel://"
        ) from None
    return None


def _parse_sentinels(url: str) -> SentinelAddress:
    def bad(why: str) -> BrokerUrlError:
        return BrokerUrlError(
            f"TFFLEET_BROKER_URL={_masked(url)!r}: {why} (the form: sentinel://:PASSWORD@HOST:"
            "26379;sentinel://:PASSWORD@HOST2:26379/0?master_name=NAME)"
        )

    sentinels: list[tuple[str, int]] = []
    found: dict[str, set[str]] = {"db": set(), "username": set(), "password": set()}
    options: dict[str, set[str]] = {}
    for part in url.split(";"):
        if not part.lower().startswith("sentinel://"):
            raise bad(f"{_masked(part)!r} is not a sentinel:// part")
        split = urlsplit(part)
        try:
            port = split.port or SENTINEL_PORT
        except ValueError:
            raise bad(f"{_masked(part)!r} has a port that is none") from None
        if not split.hostname:
            raise bad(f"{_masked(part)!r} names no host")
        sentinels.append((split.hostname, port))
        path = split.path.strip("/")
        if path:
            found["db"].add(path)
        if split.username:
            found["username"].add(unquote(split.username))
        if split.password is not None:
            found["password"].add(unquote(split.password))
        for key, value in parse_qsl(split.query, keep_blank_values=True):
            if key not in _SENTINEL_OPTIONS:
                raise bad(
                    f"unknown parameter {key!r} (known: {', '.join(sorted(_SENTINEL_OPTIONS))})"
                )
            options.setdefault(key, set()).add(value)
    for name, values in {**found, **options}.items():
        if len(values) > 1:
            raise bad(f"its parts give different {name}s")
    db = next(iter(found["db"]), "0")
    if not db.isdigit():
        raise bad(f"the database {db!r} is not a number")
    master_name = next(iter(options.get("master_name", ())), "")
    if not master_name:
        raise bad("it names no master: add ?master_name=NAME, the name the sentinels monitor")
    return SentinelAddress(
        sentinels=tuple(sentinels),
        master_name=master_name,
        db=int(db),
        username=next(iter(found["username"]), None),
        password=next(iter(found["password"]), None),
        sentinel_password=next(iter(options.get("sentinel_password", ())), None),
    )


def _masked(url: str) -> str:
    """The URL with its passwords starred, for a message."""
    parts = []
    for part in url.split(";"):
        split = urlsplit(part) if "://" in part else None
        if split is not None and split.password:
            netloc = split.netloc.replace(f":{split.password}@", ":***@", 1)
            part = split._replace(netloc=netloc).geturl()
        parts.append(part)
    masked = ";".join(parts)
    return "&".join(
        f"{p.split('=', 1)[0]}=***" if p.split("=", 1)[0].endswith("sentinel_password") else p
        for p in masked.split("&")
    )


def _sentinel_kwargs(kwargs: dict[str, Any], password: str | None) -> dict[str, Any]:
    # A sentinel answers a question or it is skipped: bounded as the client's own calls are.
    found = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    if password is not None:
        found["password"] = password
    return found


def redis_client(url: str, **kwargs: Any) -> redis.Redis:
    """A redis-py client of the broker at `url`; `kwargs` as `redis.Redis` takes them (socket
    timeouts, retry, health checks). On a `sentinel://` URL, a client of the current master."""
    address = parse_broker_url(url)
    if address is None:
        return redis.Redis.from_url(url, **kwargs)
    return _master(address, kwargs)


def async_redis_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """`redis_client`, for asyncio."""
    address = parse_broker_url(url)
    if address is None:
        return redis.asyncio.Redis.from_url(url, **kwargs)
    sentinel = redis.asyncio.sentinel.Sentinel(
        list(address.sentinels),
        sentinel_kwargs=_sentinel_kwargs(kwargs, address.sentinel_password),
        **_master_kwargs(address, kwargs),
    )
    client = sentinel.master_for(address.master_name, redis_class=_AsyncMaster)
    client.watchers = sentinel
    return client


class _Master(redis.Redis):
    """A client of the master that also closes its connections to the sentinels."""

    watchers: redis.sentinel.Sentinel | None = None

    def close(self) -> None:
        super().close()
        for client in self.watchers.sentinels if self.watchers is not None else ():
            client.close()


class _AsyncMaster(redis.asyncio.Redis):
    watchers: redis.asyncio.sentinel.Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for client in self.watchers.sentinels if self.watchers is not None else ():
            await client.aclose()


def _master_kwargs(address: SentinelAddress, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "db": address.db,
        "username": address.username,
        "password": address.password,
        **kwargs,
    }


def _master(
    address: SentinelAddress, kwargs: dict[str, Any], sentinel_kwargs: dict[str, Any] | None = None
) -> redis.Redis:
    sentinel = redis.sentinel.Sentinel(
        list(address.sentinels),
        sentinel_kwargs=sentinel_kwargs or _sentinel_kwargs(kwargs, address.sentinel_password),
        **_master_kwargs(address, kwargs),
    )
    client = sentinel.master_for(address.master_name, redis_class=_Master)
    client.watchers = sentinel
    return client


def celery_broker(url: str, **socket_options: Any) -> tuple[str, dict[str, Any]]:
    """What a Celery app is given for `url`: its broker URL and the `broker_transport_options`
    to add (none for one Redis)."""
    address = parse_broker_url(url)
    if address is None:
        return url, {}
    return address.celery_url(), address.transport_options(**socket_options)


def celery_redis_client(app: Any, **kwargs: Any) -> redis.Redis:
    """A redis-py client of a Celery app's broker, as kombu's Redis transport reaches it:
    `broker_url`, and for `sentinel://` its transport options `master_name` and
    `sentinel_kwargs`."""
    url = str(app.conf.broker_url)
    options = app.conf.broker_transport_options or {}
    if not url.lower().startswith("sentinel://"):
        return redis_client(url, **kwargs)
    address = _parse_sentinels(f"{url}?master_name={quote(options.get('master_name') or '')}")
    return _master(address, kwargs, dict(options.get("sentinel_kwargs") or {}))


def refuse_cluster(url: str, *, timeout_s: float = 2.0) -> None:
    """At a process's start: raise BrokerUrlError (CLUSTER_REFUSED) when the Redis at `url` is a
    node of a Redis Cluster (`INFO cluster`: `cluster_enabled:1`). A Redis that does not answer
    now is not checked: the process starts, and waits for it as it would anyway."""
    client = redis_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        enabled = client.info("cluster").get("cluster_enabled")
    except redis.RedisError as exc:
        log.info("could not ask the broker whether it is a cluster node (%s)", exc)
        return
    finally:
        client.close()
    if enabled in (1, "1"):
        raise BrokerUrlError(CLUSTER_REFUSED)
