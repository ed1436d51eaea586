"""tffleet: asynchronous inference jobs on TensorFlow models, run by a fleet of Celery workers.

The client is here: `tffleet.Client`, `tffleet.AsyncClient`, `tffleet.Job` and the client's
errors (root `tffleet.ClientError`), from `tffleet/client/`. They are imported on first use, so
`import tffleet` (which every process of the fleet does) stays cheap: no httpx, NumPy or
TensorFlow.

The package has three parts: the kernel that the API, the worker and the client share (this
folder's modules: settings, errors, tensors, the broker contract, ...), the client SDK
(`tffleet/client/`) and the `tffleet` command (`tffleet/cli/`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Name -> the module that defines it; imported on first access (PEP 562).
_LAZY: dict[str, str] = {
    "Client": "tffleet.client.sync",
    "AsyncClient": "tffleet.client.aio",
    "Retries": "tffleet.client.protocol",
    **dict.fromkeys(["Job", "JobError", "ModelInfo", "TensorSpec"], "tffleet.client.job"),
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
        "tffleet.client.errors",
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
    from tffleet.client.aio import AsyncClient
    from tffleet.client.errors import (
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
    from tffleet.client.job import Job, JobError, ModelInfo, TensorSpec
    from tffleet.client.protocol import Retries
    from tffleet.client.sync import Client


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tffleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
