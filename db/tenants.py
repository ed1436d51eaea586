"""Tenants and their API keys: who may do what, and the limits on what they may ask.

A key is `tff_<prefix>_<secret>`: 12 hex characters that find its row, then 43 characters of a
256-bit random secret. The database keeps the sha256 of the whole key, never the key: a secret
that random needs no slow hash, and a stolen table opens nothing. Digests are compared in
constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db.clock import utcnow
from db.models import DEFAULT_TENANT, ApiKey, Tenant
from tffleet.errors import InvalidRequest, NotFound

KEY_PREFIX = "tff_"
_KEY = re.compile(r"^tff_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")
TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Caller:
    """Who a request acts for: a tenant, and whether its key is an admin's (sees every tenant)."""

    tenant: str
    admin: bool = False
    key_prefix: str = ""

    @property
    def scope(self) -> str | None:
        """The tenant whose jobs this caller may see; None: every tenant's."""
        return None if self.admin else self.tenant


# Who every request is while auth is off (TFFLEET_AUTH=false, loopback only).
ANONYMOUS_ADMIN = Caller(tenant=DEFAULT_TENANT, admin=True)


@dataclass(frozen=True)
class NewKey:
    """A key just made: `key` is shown once and never stored."""

    key: str
    row: ApiKey


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def ensure_tenant(*, session: Session, name: str) -> Tenant:
    """The tenant named `name`, created with the fleet's default limits if new."""
    if not TENANT_NAME.match(name):
        raise InvalidRequest(
            f"tenant {name!r}: 1 to 64 characters, lower-case letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    tenant = session.get(Tenant, name)
    if tenant is None:
        tenant = Tenant(name=name, created_at=utcnow(), weight=1)
        session.add(tenant)
        session.flush()
    return tenant


def create_key(
    *, session: Session, tenant: str, admin: bool = False, note: str | None = None
) -> NewKey:
    """A new key for `tenant` (created if new)."""
    ensure_tenant(session=session, name=tenant)
    prefix = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey(
        prefix=prefix,
        tenant=tenant,
        digest=digest(key),
        admin=admin,
        note=note,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return NewKey(key=key, row=row)


def list_keys(*, session: Session, tenant: str | None = None) -> list[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.tenant, ApiKey.created_at)
    if tenant is not None:
        query = query.where(ApiKey.tenant == tenant)
    return list(session.scalars(query))


def revoke_key(*, session: Session, prefix: str) -> ApiKey:
    """Revoke the key with this prefix (the `tff_<prefix>_` part, or the whole key)."""
    match = _KEY.match(prefix)
    prefix = match.group(1) if match else prefix.removeprefix(KEY_PREFIX).rstrip("_")
    row = session.get(ApiKey, prefix)
    if row is None:
        raise NotFound(f"no API key with prefix {prefix!r}")
    if row.revoked_at is None:
        session.execute(update(ApiKey).where(ApiKey.prefix == prefix).values(revoked_at=utcnow()))
        session.refresh(row)
    return row


def authenticate(*, session: Session, key: str) -> Caller | None:
    """The caller a key stands for; None for a malformed, unknown or revoked key."""
    match = _KEY.match(key)
    if match is None:
        return None
    row = session.execute(
        select(ApiKey.digest, ApiKey.tenant, ApiKey.admin, ApiKey.revoked_at).where(
            ApiKey.prefix == match.group(1)
        )
    ).first()
    # Compared even when there is no row, so an unknown prefix costs what a known one does.
    expected = row.digest if row is not None else "0" * 64
    if not hmac.compare_digest(expected, digest(key)) or row is None or row.revoked_at:
        return None
    return Caller(tenant=row.tenant, admin=row.admin, key_prefix=match.group(1))
