"""Who is calling: `Authorization: Bearer <key>` to a `Caller` (a tenant, admin or not).

Every route but /healthz and /readyz calls `await state.auth(request)` first (a route that does
not goes into `api/openapi.py` UNKEYED, so the schema asks no key of it). Answers are cached
for `cache_s` per key (unknown keys too, so a flood of made-up keys costs no database reads):
a revoked key stops working within that time.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from db import tenants
from db.tenants import ANONYMOUS_ADMIN, Caller
from tffleet.errors import Forbidden, Unauthorized

_HOW = "send `Authorization: Bearer <key>` (make one with `tffleet keys create --tenant NAME`)"
# At most this many keys' answers are remembered; the oldest go first.
_MAX_CACHED = 10_000


class Authenticator:
    def __init__(
        self, sessions: sessionmaker[Session], *, enabled: bool = True, cache_s: float = 5.0
    ) -> None:
        self._sessions = sessions
        self._enabled = enabled
        self._cache_s = cache_s
        # sha256 of the key -> (when looked up, the caller or None)
        self._cache: OrderedDict[bytes, tuple[float, Caller | None]] = OrderedDict()

    async def __call__(self, request: Request) -> Caller:
        """The caller, or Unauthorized (401) without a valid key."""
        if not self._enabled:
            return ANONYMOUS_ADMIN
        header = request.headers.get("authorization")
        if header is None:
            raise Unauthorized(f"this route needs an API key: {_HOW}")
        scheme, _, key = header.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized(f"Authorization: expected `Bearer <key>`; {_HOW}")
        token = hashlib.sha256(key.encode("utf-8", "replace")).digest()
        now = time.monotonic()
        hit = self._cache.get(token)
        if hit is not None and now - hit[0] < self._cache_s:
            caller = hit[1]
        else:
            caller = await run_in_threadpool(self._lookup, key)
            self._cache[token] = (now, caller)
            self._cache.move_to_end(token)
            while len(self._cache) > _MAX_CACHED:
                self._cache.popitem(last=False)
        if caller is None:
            raise Unauthorized(f"the API key is unknown or revoked; {_HOW}")
        return caller

    async def admin(self, request: Request) -> Caller:
        """The caller, who must hold an admin key (403 for a tenant's)."""
        caller = await self(request)
        if not caller.admin:
            raise Forbidden(
                "this route takes an admin key (`tffleet keys create --tenant NAME --admin`)"
            )
        return caller

    def _lookup(self, key: str) -> Caller | None:
        with self._sessions() as session:
            return tenants.authenticate(session=session, key=key)
