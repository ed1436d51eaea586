"""The Python SDK: what `from tffleet import Client` gives.

    sync.py      Client: blocking calls over httpx
    aio.py       AsyncClient: the same calls for asyncio
    plans.py     what each call does, as sans-IO plans both clients drive
    bulk.py      submit_many's plan: jobs in chunked bulk requests, each stored all or none
    objects.py   tensors by reference: uploads, and outputs the API holds in its object store
    protocol.py  one HTTP exchange: requests, retries (`Retries`), responses to errors
    events.py    following a job's event stream (`Client.events`), reconnecting where it drops
    job.py       Job, ModelInfo, TensorSpec: what the API answers, with tensors as NumPy
    transforms.py        transforms over files (`Client.transform`), datasets put in the store
    transform_handle.py  TransformHandle: wait with a bar, cancel, retry, read the output back
    transform_files.py   a transform's output files fetched, read as a table or arrays
    errors.py    the errors it raises: the one tree of tffleet.errors, and the client's own

Everything here talks HTTP to the API; nothing imports the services (`api/`, `worker/`, `db/`).
"""

from tffleet.client.aio import AsyncClient
from tffleet.client.errors import (
    BadRequest,
    ClientError,
    Conflict,
    ConnectError,
    Forbidden,
    Gone,
    HTTPStatusError,
    InputsGone,
    InvalidInput,
    JobCanceled,
    JobFailed,
    NotFound,
    OutputsGone,
    PayloadTooLarge,
    ProtocolError,
    ServiceUnavailable,
    TooManyRequests,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
    WaitTimeout,
)
from tffleet.client.job import Job, JobError, ModelInfo, TensorSpec
from tffleet.client.protocol import Retries
from tffleet.client.sync import Client
from tffleet.client.transform_handle import AsyncTransformHandle, TransformHandle
from tffleet.client.transforms import Transform, TransformWaitTimeout

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
]
