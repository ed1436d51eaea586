"""Every error tffleet raises on purpose, the service's and the client's, under one root.

    TffleetError                500  the root; the client's name for it is ClientError
    ├── HTTPStatusError              an error answer: .status_code, .code, .message
    │   ├── BadRequest          400
    │   │   └── InvalidRequest       a malformed request: not JSON, a cursor we never issued
    │   ├── Unauthorized        401  no API key, or one that is unknown or revoked
    │   ├── Forbidden           403  an admin's route called with a tenant's key
    │   │   └── ModelNotAllowed      a model the key may not use (its allowed models)
    │   ├── NotFound            404
    │   │   ├── ModelNotFound        unknown model or version
    │   │   └── JobNotFound          unknown job id
    │   ├── Conflict            409
    │   │   ├── JobAlreadyFinished   cancel of a job that already ended
    │   │   ├── JobNotRetryable      retry of a job that is queued, running or succeeded
    │   │   ├── JobNotEnded          delete of a job that is queued or running
    │   │   └── IdempotencyKeyReused an Idempotency-Key sent again with a different request
    │   ├── Gone                410
    │   │   ├── InputsGone           retry of a job whose inputs are no longer stored
    │   │   └── OutputsGone          an output held in the object store that is no longer there
    │   ├── PayloadTooLarge     413
    │   ├── UnsupportedMediaType 415
    │   ├── InvalidInput        422  inputs that do not fit the model's signature
    │   ├── TooManyRequests     429
    │   │   ├── QueueFull            more queued jobs than TFFLEET_MAX_QUEUED_JOBS allows
    │   │   │   └── QuotaExceeded    more queued jobs than the tenant's quota allows
    │   │   └── RateLimited          over the key's rate, or its cap on queued plus running jobs
    │   └── ServiceUnavailable  503  database or broker unreachable
    │
    │   the client's own (tffleet/client/errors.py), never an answer:
    ├── TransportError               no answer came back (the httpx error is the __cause__)
    │   └── ConnectError             could not connect: refused, unresolvable, connect timeout
    ├── ProtocolError                an answer that is not the v1 contract (not JSON, a bad tensor)
    ├── WaitTimeout                  wait()/wait_all() ran out of time (also a builtin TimeoutError)
    └── JobFailed                    run() or Job.raise_for_error(): a job ended without outputs
        └── JobCanceled

The API raises an HTTPStatusError to answer it: each class's status and code, mapped in one
exception handler (api/app.py); the message always names the field or thing at fault. Another
tenant's job is NotFound, never Forbidden: its existence is not revealed. The client raises the
class that an error answer's status and code name (`class_for`), holding the status and code
the server sent, so a proxy's 502 is an HTTPStatusError of status 502.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    import httpx


class TffleetError(Exception):
    """The root: `except TffleetError` (or `tffleet.ClientError`) catches every error of ours.

    `status_code`, `code` and `headers` are what the API answers for it; the root's, 500
    `internal`, stand for an error that is no answer of its own.
    """

    status_code = 500
    code = "internal"
    headers: dict[str, str] = {}  # extra response headers (Retry-After, say)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        # Client.submit_many: the jobs (tffleet.Job) that its earlier requests stored before
        # this error stopped it.
        self.submitted: list[Any] = []


class HTTPStatusError(TffleetError):
    """An error answer, `{"error": {"code", "message"}}`: raised by the API to be answered, and
    by the client that reads it (`from_answer`)."""

    response: httpx.Response | None = None  # the answer, where a client read it

    @classmethod
    def from_answer(
        cls, status_code: int, code: str, message: str, *, response: httpx.Response | None = None
    ) -> Self:
        """The error as a client reads it: the status and code the server sent (a proxy's
        502 included), where the class holds those that the API sends."""
        error = cls(message)
        error.args = (f"{status_code} {code}: {message}",)  # what str() shows
        error.status_code, error.code, error.response = status_code, code, response
        return error


class BadRequest(HTTPStatusError):
    status_code = 400
    code = "bad_request"


class InvalidRequest(BadRequest):
    code = "malformed_request"


class Unauthorized(HTTPStatusError):
    status_code = 401
    code = "unauthorized"
    headers = {"WWW-Authenticate": "Bearer"}


class Forbidden(HTTPStatusError):
    status_code = 403
    code = "forbidden"


class ModelNotAllowed(Forbidden):
    code = "model_not_allowed"


class NotFound(HTTPStatusError):
    status_code = 404
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class JobNotFound(NotFound):
    code = "job_not_found"


class Conflict(HTTPStatusError):
    status_code = 409
    code = "conflict"


class JobAlreadyFinished(Conflict):
    code = "job_finished"


class JobNotRetryable(Conflict):
    code = "not_retryable"


class JobNotEnded(Conflict):
    code = "job_not_ended"


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class Gone(HTTPStatusError):
    status_code = 410
    code = "gone"


class InputsGone(Gone):
    code = "inputs_gone"


class OutputsGone(Gone):
    code = "outputs_gone"


class PayloadTooLarge(HTTPStatusError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(HTTPStatusError):
    status_code = 415
    code = "unsupported_media_type"


class InvalidInput(HTTPStatusError):
    status_code = 422
    code = "invalid_input"


class TooManyRequests(HTTPStatusError):
    status_code = 429
    code = "too_many_requests"


class QueueFull(TooManyRequests):
    code = "queue_full"
    headers = {"Retry-After": "1"}


class QuotaExceeded(QueueFull):
    code = "quota_exceeded"


class RateLimited(TooManyRequests):
    """Over the key's rate or its cap on active jobs; `Retry-After` says when to try again."""

    code = "rate_limited"
    headers = {"Retry-After": "1"}

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        # Whole seconds, as HTTP has them, rounded up: a client that waits that long may pass.
        self.headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}


class ServiceUnavailable(HTTPStatusError):
    status_code = 503
    code = "unavailable"


def _answers(parent: type[HTTPStatusError]) -> Iterator[type[HTTPStatusError]]:
    for cls in parent.__subclasses__():
        yield cls
        yield from _answers(cls)


# Read from the tree above as it stands here, so a new class is known to the client as it is
# written, and a subclass defined elsewhere (in a test, say) changes nothing.
_BY_CODE = {(cls.status_code, cls.code): cls for cls in _answers(HTTPStatusError)}
_BY_STATUS = {cls.status_code: cls for cls in HTTPStatusError.__subclasses__()}


def class_for(status_code: int, code: str) -> type[HTTPStatusError]:
    """The class of an error answer: the one of its status and code, else its status's (a code
    the API added since), else HTTPStatusError (a status it never sends, a proxy's 502)."""
    return _BY_CODE.get((status_code, code)) or _BY_STATUS.get(status_code, HTTPStatusError)
