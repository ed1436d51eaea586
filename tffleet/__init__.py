"""tffleet: asynchronous inference jobs on TensorFlow models, run by a fleet of Celery workers.

The client is here: `tffleet.Client`, `tffleet.AsyncClient`, `tffleet.Job` and the client's
errors (root `tffleet.ClientError`). They are imported on first use, so `import tffleet` (which
every process of the fleet does) stays cheap: no httpx, NumPy or TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Name -> the module that defines it; imported on first access (PEP 562).
_LAZY: dict[str, str] = {
    "Client": "tffleet.client",
    "AsyncClient": "tffleet.aio",
    "Retries": "tffleet.client_protocol",
    **dict.fromkeys(["Job", "JobError", "ModelInfo", "TensorSpec"], "tffleet.client_job"),
    **dict.fromkeys(
        [
            "ClientError",
            "TransportError",
            "ConnectError",
            "HTTPStatusError",
            "BadRequest",
            "NotFound",
            "Conflict",
            "PayloadTooLarge",
            "UnsupportedMediaType",
            "InvalidInput",
            "TooManyRequests",
            "ServiceUnavailable",
            "ProtocolError",
            "WaitTimeout",
            "JobFailed",
            "JobCanceled",
        ],
        "tffleet.client_errors",
    ),
}

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectError",
    "HTTPStatusError",
    "InvalidInput",
    "Job",
    "JobCanceled",
    "JobError",
    "JobFailed",
    "ModelInfo",
    "NotFound",
    "PayloadTooLarge",
    "ProtocolError",
    "Retries",
    "ServiceUnavailable",
    "TensorSpec",
    "TooManyRequests",
    "TransportError",
    "UnsupportedMediaType",
    "WaitTimeout",
    "__version__",
]

if TYPE_CHECKING:
    from tffleet.aio import AsyncClient
    from tffleet.client import Client
    from tffleet.client_errors import (
        BadRequest,
        ClientError,
        Conflict,
        ConnectError,
        HTTPStatusError,
        InvalidInput,
        JobCanceled,
        JobFailed,
        NotFound,
        PayloadTooLarge,
        ProtocolError,
        ServiceUnavailable,
        TooManyRequests,
        TransportError,
        UnsupportedMediaType,
        WaitTimeout,
    )
    from tffleet.client_job import Job, JobError, ModelInfo, TensorSpec
    from tffleet.client_protocol import Retries


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tffleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
