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
from db.key_limits import NO_KEY_LIMITS, KeyLimits, models_of
from db.models import DEFAULT_TENANT, ApiKey, Tenant
from tffleet.errors import InvalidRequest, NotFound
from tffleet.settings import Settings

KEY_PREFIX = "tff_"
_KEY = re.compile(r"^tff_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")
TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Caller:
    """Who a request acts for: a tenant, whether its key is an admin's (sees every tenant), and
    the key's own limits (db.key_limits)."""

    tenant: str
    admin: bool = False
    key_prefix: str = ""
    limits: KeyLimits = NO_KEY_LIMITS

    @property
    def scope(self) -> str | None:
        """The tenant whose jobs this caller may see; None: every tenant's."""
        return None if self.admin else self.tenant


# Who every request is while auth is off (TFFLEET_AUTH=false, loopback only).
ANONYMOUS_ADMIN = Caller(tenant=DEFAULT_TENANT, admin=True)


@dataclass(frozen=True)
class Limits:
    """What one tenant may ask (see `Tenant`): the fleet's defaults where its own are null."""

    max_queued_jobs: int  # 0: no limit
    max_samples_per_job: int
    max_priority: int
    max_ttl_s: int
    weight: int = 1

    @classmethod
    def defaults(cls, settings: Settings) -> Limits:
        """The fleet's defaults (TFFLEET_TENANT_*)."""
        return cls(
            max_queued_jobs=settings.tenant_max_queued_jobs,
            max_samples_per_job=settings.tenant_max_samples_per_job,
            max_priority=settings.tenant_max_priority,
            max_ttl_s=settings.tenant_max_ttl_s,
        )

    def over(self, tenant: Tenant | None) -> Limits:
        """These limits with `tenant`'s own where it has them."""
        if tenant is None:
            return self
        return Limits(
            max_queued_jobs=_either(tenant.max_queued_jobs, self.max_queued_jobs),
            max_samples_per_job=_either(tenant.max_samples_per_job, self.max_samples_per_job),
            max_priority=_either(tenant.max_priority, self.max_priority),
            max_ttl_s=_either(tenant.max_ttl_s, self.max_ttl_s),
            weight=tenant.weight,
        )


# Each limit's allowed range, as the settings allow it (TFFLEET_TENANT_*).
LIMIT_RANGES = {
    "max_queued_jobs": (0, 2**31 - 1),
    "max_samples_per_job": (1, 2**31 - 1),
    "max_priority": (-1000, 1000),
    "max_ttl_s": (1, 366 * 24 * 3600),
    "weight": (1, 1000),
}


def _either(own: int | None, default: int) -> int:
    return default if own is None else own


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


def limits(*, session: Session, name: str, defaults: Limits) -> Limits:
    return defaults.over(session.get(Tenant, name))


def list_tenants(*, session: Session) -> list[Tenant]:
    return list(session.scalars(select(Tenant).order_by(Tenant.name)))


def set_limits(*, session: Session, name: str, **values: int | None) -> Tenant:
    """Set a tenant's own limits (created if new); a value of None goes back to the default.

    Only the limits named in `values` change: `max_queued_jobs`, `max_samples_per_job`,
    `max_priority`, `max_ttl_s`, `weight` (None: 1)."""
    unknown = set(values) - set(LIMIT_RANGES)
    if unknown:
        raise ValueError(f"set_limits: unknown limits {sorted(unknown)}")
    for field, value in values.items():
        low, high = LIMIT_RANGES[field]
        if value is not None and not low <= value <= high:
            raise InvalidRequest(f"{field}: between {low} and {high}, got {value}")
    tenant = ensure_tenant(session=session, name=name)
    for field, value in values.items():
        setattr(tenant, field, 1 if field == "weight" and value is None else value)
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


def find_key(*, session: Session, prefix: str) -> ApiKey:
    """The key with this prefix (the `tff_<prefix>_` part, or the whole key); NotFound."""
    match = _KEY.match(prefix)
    prefix = match.group(1) if match else prefix.removeprefix(KEY_PREFIX).rstrip("_")
    row = session.get(ApiKey, prefix)
    if row is None:
        raise NotFound(f"no API key with prefix {prefix!r}")
    return row


def revoke_key(*, session: Session, prefix: str) -> ApiKey:
    """Revoke the key with this prefix (the `tff_<prefix>_` part, or the whole key)."""
    row = find_key(session=session, prefix=prefix)
    prefix = row.prefix
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
        select(
            ApiKey.digest,
            ApiKey.tenant,
            ApiKey.admin,
            ApiKey.revoked_at,
            ApiKey.rate_per_s,
            ApiKey.rate_burst,
            ApiKey.max_active_jobs,
            ApiKey.allowed_models,
        ).where(ApiKey.prefix == match.group(1))
    ).first()
    # Compared even when there is no row, so an unknown prefix costs what a known one does.
    expected = row.digest if row is not None else "0" * 64
    if not hmac.compare_digest(expected, digest(key)) or row is None or row.revoked_at:
        return None
    limits = KeyLimits(
        rate_per_s=row.rate_per_s,
        rate_burst=row.rate_burst,
        max_active_jobs=row.max_active_jobs,
        models=models_of(row.allowed_models),
    )
    return Caller(
        tenant=row.tenant,
        admin=row.admin,
        key_prefix=match.group(1),
        limits=NO_KEY_LIMITS if limits == NO_KEY_LIMITS else limits,
    )
