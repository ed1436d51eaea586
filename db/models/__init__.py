"""The rows, a module per family; every name is re-exported here (`from db.models import Job`).

`base` (the declarative base, UTC times), `tenants` (tenants, API keys, the fleet's secrets),
`jobs` (jobs, their statuses, error codes and inputs), `objects` (uploads, garbage, the response
cache), `registry` (model versions, presence), `webhooks` (the outbox), `transforms` (a model run
over files; its shards are jobs), `usage` (what ended jobs cost, by hour). Importing this package
imports them all, so `Base.metadata` holds every table (Alembic's env.py relies on it).
"""

from db.models.base import Base, UTCDateTime
from db.models.jobs import FINISHED, Job, JobErrorCode, JobInput, JobStatus
from db.models.objects import CacheEntry, JobUpload, ObjectGarbage, Upload
from db.models.registry import ModelPresence, ModelVersion, PresenceState
from db.models.tenants import DEFAULT_TENANT, ApiKey, FleetSecret, Tenant
from db.models.transforms import TRANSFORM_FINISHED, Transform, TransformStatus
from db.models.usage import UsageRecord
from db.models.webhooks import DeliveryStatus, WebhookDelivery

__all__ = [
    "DEFAULT_TENANT",
    "FINISHED",
    "TRANSFORM_FINISHED",
    "ApiKey",
    "Base",
    "CacheEntry",
    "DeliveryStatus",
    "FleetSecret",
    "Job",
    "JobErrorCode",
    "JobInput",
    "JobStatus",
    "JobUpload",
    "ModelPresence",
    "ModelVersion",
    "ObjectGarbage",
    "PresenceState",
    "Tenant",
    "Transform",
    "TransformStatus",
    "UTCDateTime",
    "Upload",
    "UsageRecord",
    "WebhookDelivery",
]
