"""tffleet: asynchronous inference jobs on TensorFlow models, run by a fleet of Celery workers.

The client is here: `tffleet.Client`, `tffleet.AsyncClient`, `tffleet.Job`, `tffleet.Transform`
(a transform as shown) with the handles `Client.transform` and `AsyncClient.transform` return,
and the errors it raises (root `tffleet.ClientError`, the one tree of `tffleet.errors`), from
`tffleet/client/`. They are imported on first use, so `import tffleet` (which every process of
the fleet does) stays cheap: no httpx, NumPy or TensorFlow. No client module imports this
package's `__init__` (they take `__version__` from `tffleet.version`), so the lazy import
closes no circle.

The package has three parts: the kernel that the API, the worker and the client share (this
folder's modules: settings, errors, tensors, the broker contract, ...), the client SDK
(`tffleet/client/`) and the `tffleet` command (`tffleet/cli/`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tffleet.version import __version__

__all__ = [
    "AsyncClient",
    "AsyncTransformHandle",
    "BadRequest",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectError",
    "Forbidden",
    "Gone",
    "HTTPStatusError",
    "InputsGone",
    "InvalidInput",
    "Job",
    "JobCanceled",
    "JobError",
    "JobFailed",
    "ModelInfo",
    "NotFound",
    "OutputsGone",
    "PayloadTooLarge",
    "ProtocolError",
    "Retries",
    "ServiceUnavailable",
    "TensorSpec",
    "TooManyRequests",
    "Transform",
    "TransformHandle",
    "TransformWaitTimeout",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
    "WaitTimeout",
    "__version__",
]

if TYPE_CHECKING:  # what __getattr__ hands out, for type checkers
    from tffleet.client import (
        AsyncClient,
        AsyncTransformHandle,
        BadRequest,
        Client,
        ClientError,
        Conflict,
        ConnectError,
        Forbidden,
        Gone,
        HTTPStatusError,
        InputsGone,
        InvalidInput,
        Job,
        JobCanceled,
        JobError,
        JobFailed,
        ModelInfo,
        NotFound,
        OutputsGone,
        PayloadTooLarge,
        ProtocolError,
        Retries,
        ServiceUnavailable,
        TensorSpec,
        TooManyRequests,
        Transform,
        TransformHandle,
        TransformWaitTimeout,
        TransportError,
        Unauthorized,
        UnsupportedMediaType,
        WaitTimeout,
    )


def __getattr__(name: str) -> Any:
    """The client's names, imported on first use (PEP 562)."""
    if name not in __all__:
        raise AttributeError(f"module 'tffleet' has no attribute {name!r}")
    value = getattr(importlib.import_module("tffleet.client"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
