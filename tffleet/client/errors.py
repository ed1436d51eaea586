"""The client's errors: the one tree of `tffleet.errors` (drawn there), and the client's own.

An error answer raises the class of the tree that its status and code name (`NotFound`,
`JobNotFound`, `InputsGone`, ...), the very class the API raised to answer it: `tffleet.NotFound
is tffleet.errors.NotFound`. What no answer carries is added here, under the same root:
`TransportError` (no answer came back), `ProtocolError` (an answer that is not the contract),
`WaitTimeout` and `JobFailed`. `ClientError` is the client's name for the root, `TffleetError`.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tffleet.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    HTTPStatusError,
    IdempotencyKeyReused,
    InputsGone,
    InvalidInput,
    InvalidRequest,
    JobAlreadyFinished,
    JobNotEnded,
    JobNotFound,
    JobNotRetryable,
    ModelNotAllowed,
    ModelNotFound,
    NotFound,
    OutputsGone,
    PayloadTooLarge,
    QueueFull,
    QuotaExceeded,
    RateLimited,
    ServiceUnavailable,
    TffleetError,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
)

if TYPE_CHECKING:
    from tffleet.client.job import Job

__all__ = [
    "BadRequest",
    "ClientError",
    "Conflict",
    "ConnectError",
    "Forbidden",
    "Gone",
    "HTTPStatusError",
    "IdempotencyKeyReused",
    "InputsGone",
    "InvalidInput",
    "InvalidRequest",
    "JobAlreadyFinished",
    "JobCanceled",
    "JobFailed",
    "JobNotEnded",
    "JobNotFound",
    "JobNotRetryable",
    "ModelNotAllowed",
    "ModelNotFound",
    "NotFound",
    "OutputsGone",
    "PayloadTooLarge",
    "ProtocolError",
    "QueueFull",
    "QuotaExceeded",
    "RateLimited",
    "ServiceUnavailable",
    "TffleetError",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "UnsupportedMediaType",
    "WaitTimeout",
]

# `except tffleet.ClientError` catches everything the client raises on purpose, as it always has.
ClientError = TffleetError


class TransportError(TffleetError):
    pass


class ConnectError(TransportError):
    pass


class ProtocolError(TffleetError):
    pass


class WaitTimeout(TffleetError, builtins.TimeoutError):
    """Jobs still unfinished when the wait ran out; `.jobs` is every job as last seen."""

    def __init__(self, message: str, *, jobs: Sequence[Job]) -> None:
        super().__init__(message)
        self.jobs = list(jobs)


class JobFailed(TffleetError):
    """A job that ended `failed` (or `canceled`); `.job` is the job, `.job.error` says why."""

    def __init__(self, job: Job) -> None:
        if job.error is not None:
            why = f"failed: {job.error.code}: {job.error.message}"
        else:
            why = f"ended {job.status}"
        super().__init__(f"job {job.id} ({job.model} v{job.version}) {why}")
        self.job = job


class JobCanceled(JobFailed):
    pass
