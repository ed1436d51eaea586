"""Every error the client raises, under one root.

    ClientError
    ├── TransportError          no answer came back (the httpx error is the __cause__)
    │   └── ConnectError            could not connect: refused, unresolvable, connect timeout
    ├── HTTPStatusError         the API answered an error: .status_code, .code, .message
    │   ├── BadRequest          400  malformed request
    │   ├── Unauthorized        401  no API key, or an unknown or revoked one
    │   ├── Forbidden           403  an admin's route with a tenant's key
    │   ├── NotFound            404  unknown model, version or job
    │   ├── Conflict            409  cancel of an ended job, retry or delete of one not ended
    │   ├── PayloadTooLarge     413
    │   ├── UnsupportedMediaType 415
    │   ├── InvalidInput        422  inputs that do not fit the model's signature
    │   ├── TooManyRequests     429  queue full
    │   └── ServiceUnavailable  503  database or broker unreachable
    ├── ProtocolError           an answer that is not the v1 contract (not JSON, a bad tensor)
    ├── WaitTimeout             wait()/wait_all() ran out of time (also a builtin TimeoutError)
    └── JobFailed               run() or Job.raise_for_error() on a job that ended without outputs
        └── JobCanceled

These are the client's, not the service's: `tffleet.errors.TffleetError` is what the API raises
to be mapped to a status, with the status fixed per class; here the status and code are whatever
the server answered (a proxy's 502 included), so the two trees stay apart.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

    from tffleet.client.job import Job


class ClientError(Exception):
    """The root: `except tffleet.ClientError` catches everything the client raises on purpose."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        # submit_many: the jobs of earlier requests, stored before this error stopped it.
        self.submitted: list[Job] = []


class TransportError(ClientError):
    pass


class ConnectError(TransportError):
    pass


class HTTPStatusError(ClientError):
    """An error response, `{"error": {"code", "message"}}`; the message names the field at fault."""

    def __init__(
        self, status_code: int, code: str, message: str, *, response: httpx.Response | None = None
    ) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.response = response


class BadRequest(HTTPStatusError):
    pass


class Unauthorized(HTTPStatusError):
    pass


class Forbidden(HTTPStatusError):
    pass


class NotFound(HTTPStatusError):
    pass


class Conflict(HTTPStatusError):
    pass


class PayloadTooLarge(HTTPStatusError):
    pass


class UnsupportedMediaType(HTTPStatusError):
    pass


class InvalidInput(HTTPStatusError):
    pass


class TooManyRequests(HTTPStatusError):
    pass


class ServiceUnavailable(HTTPStatusError):
    pass


BY_STATUS: dict[int, type[HTTPStatusError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidInput,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


class ProtocolError(ClientError):
    pass


class WaitTimeout(ClientError, builtins.TimeoutError):
    """Jobs still unfinished when the wait ran out; `.jobs` is every job as last seen."""

    def __init__(self, message: str, *, jobs: Sequence[Job]) -> None:
        super().__init__(message)
        self.jobs = list(jobs)


class JobFailed(ClientError):
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
