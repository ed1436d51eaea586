"""Every error tffleet raises on purpose, under one root.

    TffleetError
    ├── InvalidRequest          400  a malformed request: not JSON, a cursor we never issued
    ├── Unauthorized            401  no API key, or one that is unknown or revoked
    ├── Forbidden               403  an admin's route called with a tenant's key
    ├── NotFound                404
    │   ├── ModelNotFound           unknown model or version
    │   └── JobNotFound             unknown job id
    ├── Conflict                409
    │   ├── JobAlreadyFinished      cancel of a job that already ended
    │   ├── JobNotRetryable         retry of a job that is queued, running or succeeded
    │   ├── JobNotEnded             delete of a job that is queued or running
    │   └── IdempotencyKeyReused    an Idempotency-Key sent again with a different request
    ├── Gone                    410
    │   └── InputsGone              retry of a job whose inputs are no longer stored
    ├── PayloadTooLarge         413
    ├── UnsupportedMediaType    415
    ├── InvalidInput            422  inputs that do not fit the model's signature
    ├── QueueFull               429  more queued jobs than TFFLEET_MAX_QUEUED_JOBS allows
    │   └── QuotaExceeded           more queued jobs than the tenant's quota allows
    └── ServiceUnavailable      503  database or broker unreachable

The API maps each class to its HTTP status in one exception handler; the message always names
the field or thing at fault. Another tenant's job is NotFound, never Forbidden: its existence is
not revealed.
"""

from __future__ import annotations


class TffleetError(Exception):
    status_code = 500
    code = "internal"
    headers: dict[str, str] = {}  # extra response headers (Retry-After, say)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(TffleetError):
    status_code = 400
    code = "malformed_request"


class Unauthorized(TffleetError):
    status_code = 401
    code = "unauthorized"
    headers = {"WWW-Authenticate": "Bearer"}


class Forbidden(TffleetError):
    status_code = 403
    code = "forbidden"


class NotFound(TffleetError):
    status_code = 404
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class JobNotFound(NotFound):
    code = "job_not_found"


class Conflict(TffleetError):
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


class Gone(TffleetError):
    status_code = 410
    code = "gone"


class InputsGone(Gone):
    code = "inputs_gone"


class PayloadTooLarge(TffleetError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(TffleetError):
    status_code = 415
    code = "unsupported_media_type"


class InvalidInput(TffleetError):
    status_code = 422
    code = "invalid_input"


class QueueFull(TffleetError):
    status_code = 429
    code = "queue_full"
    headers = {"Retry-After": "1"}


class QuotaExceeded(QueueFull):
    code = "quota_exceeded"


class ServiceUnavailable(TffleetError):
    status_code = 503
    code = "unavailable"
