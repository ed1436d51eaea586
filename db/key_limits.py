"""An API key's own limits (DESIGN §15): its rate, its cap on active jobs, the models it may use.

Each is null for none (`ApiKey.rate_per_s`, `rate_burst`, `max_active_jobs`, `allowed_models`);
`tffleet keys create|set` sets them, the API reads them with the key (db.tenants.authenticate)
and checks them at every submit (api/key_limits.py).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import ApiKey, Job, JobStatus
from tffleet.errors import InvalidRequest

MAX_RATE_PER_S = 1_000_000.0
MAX_BURST = 1_000_000
MAX_ACTIVE_JOBS = 2**31 - 1
MAX_MODELS = 1000
MAX_MODEL_NAME = 200  # as Job.model


class Unset(enum.Enum):
    """`set_key_limits`: leave this limit as it is."""

    UNSET = 0


UNSET = Unset.UNSET


@dataclass(frozen=True)
class KeyLimits:
    """A key's limits; None: no limit of that kind."""

    rate_per_s: float | None = None
    rate_burst: int | None = None
    max_active_jobs: int | None = None
    models: frozenset[str] | None = None

    @property
    def burst(self) -> int:
        """Jobs the key may send at once: its own burst, else a second of its rate (at least 1)."""
        if self.rate_burst is not None:
            return self.rate_burst
        return max(1, math.ceil(self.rate_per_s or 0))

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    @classmethod
    def of(cls, row: ApiKey) -> KeyLimits:
        return cls(
            rate_per_s=row.rate_per_s,
            rate_burst=row.rate_burst,
            max_active_jobs=row.max_active_jobs,
            models=models_of(row.allowed_models),
        )

    def describe(self) -> str:
        """As `tffleet keys` shows them: `rate 5/s burst 10, at most 100 active, models a, b`."""
        rate = (
            "no rate"
            if self.rate_per_s is None
            else f"rate {self.rate_per_s:g}/s burst {self.burst}"
        )
        active = (
            "no cap" if self.max_active_jobs is None else f"at most {self.max_active_jobs} active"
        )
        models = (
            "every model" if self.models is None else "models " + ", ".join(sorted(self.models))
        )
        return f"{rate}, {active}, {models}"


NO_KEY_LIMITS = KeyLimits()


def models_of(stored: str | None) -> frozenset[str] | None:
    """`ApiKey.allowed_models` (a JSON array of names) as a set; None: every model."""
    if stored is None:
        return None
    return frozenset(str(name) for name in orjson.loads(stored))


def check_rate(value: float | None) -> float | None:
    if value is not None and not (0 < value <= MAX_RATE_PER_S and math.isfinite(value)):
        raise InvalidRequest(
            f"rate: jobs a second, above 0 and at most {MAX_RATE_PER_S:g}, got {value}"
        )
    return value


def check_count(field: str, value: int | None, high: int) -> int | None:
    if value is not None and not 1 <= value <= high:
        raise InvalidRequest(f"{field}: between 1 and {high}, got {value}")
    return value


def check_models(names: Iterable[str] | None) -> str | None:
    """The allowed models as stored (a sorted JSON array), after checking them; None: every one."""
    if names is None:
        return None
    found = sorted({name.strip() for name in names})
    if not found or "" in found:
        raise InvalidRequest("models: name one model or more (a,b), or none for every model")
    if len(found) > MAX_MODELS:
        raise InvalidRequest(f"models: at most {MAX_MODELS} names, got {len(found)}")
    for name in found:
        if len(name) > MAX_MODEL_NAME or "\x00" in name:
            raise InvalidRequest(f"models: {name[:40]!r}... is no model name")
    return orjson.dumps(found).decode()


def set_key_limits(
    *,
    session: Session,
    row: ApiKey,
    rate_per_s: float | Unset | None = UNSET,
    rate_burst: int | Unset | None = UNSET,
    max_active_jobs: int | Unset | None = UNSET,
    models: Iterable[str] | Unset | None = UNSET,
) -> ApiKey:
    """Set the limits given (None: no limit of that kind), leave the others; InvalidRequest
    naming the limit for a value out of range, or for a burst without a rate."""
    if not isinstance(rate_per_s, Unset):
        row.rate_per_s = check_rate(rate_per_s)
    if not isinstance(rate_burst, Unset):
        row.rate_burst = check_count("burst", rate_burst, MAX_BURST)
    if not isinstance(max_active_jobs, Unset):
        row.max_active_jobs = check_count("max_active_jobs", max_active_jobs, MAX_ACTIVE_JOBS)
    if not isinstance(models, Unset):
        row.allowed_models = check_models(models)
    if row.rate_burst is not None and row.rate_per_s is None:
        raise InvalidRequest("burst: a burst needs a rate (set one with --rate)")
    session.flush()
    return row


_ACTIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


def count_active(*, session: Session, tenant: str) -> int:
    """The tenant's queued and running jobs: what a key's `max_active_jobs` caps. A job does not
    record the key that submitted it, so a key's cap counts its tenant's jobs. A split job's
    parts are left out (the job counts once), as in its queued count (db.jobs.count_queued)."""
    query = (
        select(func.count())
        .select_from(Job)
        .where(Job.tenant == tenant, Job.status.in_(_ACTIVE), Job.parent_id.is_(None))
    )
    return int(session.scalar(query) or 0)
