"""A key's own limits (DESIGN §15, `tffleet keys create|set`), checked at every submit beside the
tenant's quotas (api/admission.py calls `RateLimiter.take`; api/submission.py `check_model`).

- Its models: a job for another model is 403 `model_not_allowed`, naming the model.
- Its cap on queued plus running jobs: 429 `rate_limited`. A job does not record the key that
  submitted it, so the count is the key's tenant's (db.key_limits.count_active), read as the
  tenant's queued count is (api/admission.py).
- Its rate, jobs a second with a burst: a token bucket in Redis, taken from by one Lua script, so
  every API process of every host draws on the same bucket. A request of N jobs takes N tokens or
  none (429 `rate_limited`, `Retry-After` the seconds until the bucket holds them); a request of
  more jobs than the burst could never pass, and is 422 naming `jobs`.

What it costs: a key without a rate, nothing. With one, a round trip to Redis per request, less:
- a process that was just refused knows the most the bucket can hold since (what Redis said it
  held, plus the refill since it asked), and refuses a request that cannot fit without asking;
- a process takes a few tokens more than it needs while the bucket has them (at most `LEASE_S`
  of the rate, and a tenth of the burst), spends them on the next requests of the key without
  asking, and gives back those it has not spent within `LEASE_S` with its next call. No job
  passes without a token of the shared bucket, so the rate holds; a process may hold a few
  tokens that another is refused meanwhile.

Redis unreachable: the check fails open (the request passes, and a warning is logged at most
every `WARN_EVERY_S`) and Redis is not asked again for `RETRY_S`: jobs are durable in SQL, and
a lost Redis must not stop the fleet from taking them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.connection import Connection

from db.key_limits import KeyLimits
from db.tenants import Caller
from tffleet.constants import RATE_BUCKET_KEY
from tffleet.errors import InvalidInput, ModelNotAllowed, RateLimited
from tffleet.redis_urls import async_redis_client

log = logging.getLogger(__name__)

LEASE_S = 0.05  # tokens a process takes ahead: at most this long of the rate
RETRY_S = 2.0  # after Redis failed, how long the check passes without asking it
WARN_EVERY_S = 30.0
TIMEOUT_S = 0.25  # a Redis call that takes longer fails (open); tried twice at most
_MAX_KEYS = 10_000  # keys whose local state a process keeps; the least recent go first
_KEPT_MAX = 32  # connections to Redis kept between calls

# KEYS[1]: the bucket, a hash of `tokens` and `at` (Redis's clock, seconds). ARGV: the rate
# (tokens a second), the burst (what it holds at most), `need` (taken all or none), `extra` (as
# many more as it holds, at most), `back` (tokens taken earlier and not spent, returned).
# Answers {tokens granted (0: refused), tokens it holds now}.
_TAKE = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local need, extra, back = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = burst
if held[1] then
  tokens = tonumber(held[1]) + math.max(0, now - tonumber(held[2])) * rate
end
tokens = math.min(burst, tokens + back)
local granted = 0
if tokens >= need then
  granted = need + math.min(extra, math.floor(tokens - need))
  tokens = tokens - granted
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
           'at', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {granted, string.format('%.17g', tokens)}
"""


class _Script:
    """`await script(key, *args)`: EVALSHA of one Lua script with one key, on connections of its
    own (redis-py's, kept in a free list: one per call in flight). The client's connection pool
    and command layers cost a call about a third of its CPU (docs/how-to/benchmarks.md, "Usage
    and limits"); here a call writes the command and reads its answer, under the connection's
    timeouts. A connection that fails is dropped; a kept one Redis closed since is tried again
    once, at once, on a new one. The script is loaded again when Redis lost it (a restart)."""

    def __init__(self, url: str, script: str) -> None:
        self._url, self._script = url, script
        self._sha = hashlib.sha1(script.encode()).hexdigest()
        self._client: redis.asyncio.Redis | None = None
        self._free: list[Connection] = []

    async def __call__(self, key: str, *args: object) -> Any:
        if self._client is None:  # for its connections: the URL's settings, Sentinel's master
            self._client = async_redis_client(
                self._url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
            )
        if self._free:
            try:
                return await self._on(self._free.pop(), key, args)
            except (redis.ConnectionError, OSError):
                pass  # closed since it was last used: once more, on a new one
        return await self._on(self._client.connection_pool.make_connection(), key, args)

    async def _on(self, conn: Connection, key: str, args: tuple[object, ...]) -> Any:
        """The call on `conn`, kept for the next one unless it failed (or enough are kept)."""
        try:
            answer = await self._evalsha(conn, key, args)
        except BaseException:
            await conn.disconnect()
            raise
        if len(self._free) < _KEPT_MAX:
            self._free.append(conn)
        else:  # a burst of concurrent calls is over: keep a few of its connections
            await conn.disconnect()
        return answer

    async def _evalsha(self, conn: Connection, key: str, args: tuple[object, ...]) -> Any:
        await conn.send_command("EVALSHA", self._sha, 1, key, *args)
        try:
            return await conn.read_response()
        except redis.exceptions.NoScriptError:
            await conn.send_command("SCRIPT", "LOAD", self._script)
            await conn.read_response()
            await conn.send_command("EVALSHA", self._sha, 1, key, *args)
            return await conn.read_response()

    async def close(self) -> None:
        free, self._free = self._free, []
        for conn in free:
            await conn.disconnect()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def check_model(caller: Caller, model: str, where: str = "model") -> None:
    """403 `model_not_allowed` naming the model unless the caller's key may use it."""
    allowed = caller.limits.models
    if allowed is not None and model not in allowed:
        raise ModelNotAllowed(
            f"{where}: key {caller.key_prefix} may not use model {model!r}; it may use "
            f"{', '.join(repr(name) for name in sorted(allowed))}"
        )


@dataclass
class _Local:
    """What one process knows of a key's bucket."""

    held: int = 0  # tokens taken ahead, spendable until `held_until`
    held_until: float = 0.0
    back: int = 0  # tokens held past `held_until`, to give back with the next call
    seen: float = 0.0  # what the bucket held at `seen_at` (after this process's last call)
    seen_at: float | None = None


class RateLimiter:
    """Each key's token bucket in Redis at `redis_url`: `await take(caller, n)`."""

    def __init__(self, redis_url: str) -> None:
        self._redis = _Script(redis_url, _TAKE)
        self._local: OrderedDict[str, _Local] = OrderedDict()
        self._down_until = -float("inf")
        self._warned_at = -float("inf")

    async def take(self, caller: Caller, n: int) -> None:
        """Take `n` tokens from the caller's key's bucket, or raise RateLimited (none taken)."""
        limits = caller.limits
        rate = limits.rate_per_s
        if rate is None or n <= 0:
            return
        burst = limits.burst
        if n > burst:
            raise InvalidInput(
                f"jobs: {n} in one request, more than key {caller.key_prefix} may send at once "
                f"(its burst, {burst}); send at most {burst} a request"
            )
        local = self._state(caller.key_prefix)
        now = time.monotonic()
        if local.held and now >= local.held_until:
            local.back, local.held = local.back + local.held, 0
        if local.held >= n:
            local.held -= n
            return
        if local.seen_at is not None:
            # The most the bucket can hold now: others take from it, and give back only tokens
            # they took ahead (a few: this may refuse a request a lease's worth too early).
            most = min(burst, local.seen + (now - local.seen_at) * rate) + local.held
            if most < n:
                raise self._refused(caller, limits, n, (n - most) / rate)
        if now < self._down_until:
            return  # Redis failed lately: open
        spent, local.held = local.held, 0
        back, local.back = local.back, 0
        extra = int(min(rate * LEASE_S, burst / 10))
        try:
            granted, level = await self._call(caller.key_prefix, limits, n - spent, extra, back)
        except (redis.RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return
        local.seen, local.seen_at = level, now
        if not granted:
            local.held += spent  # not spent after all (still until `held_until`)
            raise self._refused(caller, limits, n, (n - spent - level) / rate)
        local.held += granted - (n - spent)
        local.held_until = now + LEASE_S

    async def close(self) -> None:
        await self._redis.close()

    async def _call(
        self, prefix: str, limits: KeyLimits, need: int, extra: int, back: int
    ) -> tuple[int, float]:
        granted, level = await self._redis(
            RATE_BUCKET_KEY.format(prefix=prefix),
            repr(limits.rate_per_s), limits.burst, need, extra, back,
        )  # fmt: skip
        return int(granted), float(level)

    def _state(self, prefix: str) -> _Local:
        local = self._local.get(prefix)
        if local is None:
            local = self._local[prefix] = _Local()
            while len(self._local) > _MAX_KEYS:
                self._local.popitem(last=False)
        else:
            self._local.move_to_end(prefix)
        return local

    def _refused(self, caller: Caller, limits: KeyLimits, n: int, wait_s: float) -> RateLimited:
        jobs = "1 job" if n == 1 else f"{n} jobs"
        return RateLimited(
            f"key {caller.key_prefix} is over its rate ({limits.rate_per_s:g} jobs a second, "
            f"burst {limits.burst}): {jobs} would pass in {max(wait_s, 0.0):.2f} s "
            "(Retry-After rounds it up)",
            retry_after_s=wait_s,
        )

    def _failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        self._down_until = now + RETRY_S
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "rate limits: Redis unreachable (%s); requests pass unchecked for their rate "
                "until it answers (their models and caps are still checked)",
                exc,
            )
