"""What the client hands back: a `Job` and a `ModelInfo`, small frozen values read off the wire."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from tffleet import tensors
from tffleet.client.errors import JobCanceled, JobFailed, ProtocolError

# The contract's statuses a job never leaves (db.models.FINISHED; a test keeps the two in step).
FINISHED = frozenset({"succeeded", "failed", "canceled"})

# Inputs of at least this many bytes, all NumPy arrays of numbers or bools, are sent as a binary
# body (.npz, or .npy for one bare array) instead of JSON: the API then reads them with a
# memcpy instead of parsing base64 out of JSON.
BINARY_BODY_MIN_BYTES = 64 * 1024

# Whether this process has warned of a float64 array sent (`_note_dtype`): once, not once a job.
_float64_warned = False


@dataclass(frozen=True)
class JobError:
    code: str  # invalid_input, model_error, worker_lost, timeout, ...
    message: str


@dataclass(frozen=True)
class OutputRef:
    """An output the API gave by reference, held in its object store (too big to inline): the
    client fetches it (`GET /v1/jobs/{id}/outputs/{name}`) into `Job.outputs`."""

    uri: str  # tffleet://jobs/<id>/outputs/<name>
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Usage:
    """What an ended job cost: seconds queued and running, its share by samples of the forward
    passes it took part in (device seconds), its samples."""

    queue_s: float
    run_s: float
    device_s: float
    samples: int

    @classmethod
    def from_wire(cls, data: Any) -> Usage | None:
        if data is None:
            return None
        return cls(
            queue_s=float(data["queue_s"]),
            run_s=float(data["run_s"]),
            device_s=float(data["device_s"]),
            samples=int(data["samples"]),
        )


@dataclass(frozen=True)
class Job:
    """A job as the API last showed it. `outputs` is set once it has succeeded."""

    id: str
    model: str
    version: int
    status: str  # queued, running, succeeded, failed, canceled
    priority: int
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: JobError | None
    outputs: dict[str, np.ndarray] | None
    worker: str | None = None
    # A job larger than a batch, split across the fleet's children: (samples done, samples).
    progress: tuple[int, int] | None = None
    # Answered from the model's response cache: a job with equal inputs had succeeded.
    cached: bool = False
    # Its `cancel_after`: not ended by then, it is canceled (error `deadline`).
    deadline_at: datetime | None = None
    # Its `queue_timeout`: not started by then, it is canceled (error `queue_timeout`).
    queue_timeout_at: datetime | None = None
    # While queued: how many queued jobs of its model version go before it (by fair share
    # between tenants, then priority and age), and the seconds until it may end at the recent
    # pace; both estimates, None once it runs (eta_s also when nothing finished lately).
    queue_position: int | None = None
    eta_s: float | None = None
    # The outputs the API gave by reference, by name: fetched by the client, which puts them
    # in `outputs` with the others, so `outputs` holds every output either way. None where
    # none was: an .npz answer carries the outputs held in the API's store with the others.
    references: dict[str, OutputRef] | None = None
    # Once it ended: what it cost (None until then, and from an older API).
    usage: Usage | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def raise_for_error(self) -> Job:
        """Raise `JobFailed` (or `JobCanceled`) if the job ended without outputs; else return it."""
        if self.status == "canceled":
            raise JobCanceled(self)
        if self.status == "failed":
            raise JobFailed(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The job's JSON form, outputs as nested lists."""
        return {
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "status": self.status,
            "priority": self.priority,
            "attempts": self.attempts,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "error": (
                {"code": self.error.code, "message": self.error.message} if self.error else None
            ),
            "outputs": (
                {name: tensors.encode(array) for name, array in self.outputs.items()}
                if self.outputs is not None
                else None
            ),
            "worker": self.worker,
            "progress": (
                {"samples_done": self.progress[0], "samples": self.progress[1]}
                if self.progress is not None
                else None
            ),
            "cached": self.cached,
            "deadline_at": _iso(self.deadline_at),
            "queue_timeout_at": _iso(self.queue_timeout_at),
            "queue_position": self.queue_position,
            "eta_s": self.eta_s,
            "usage": dict(self.usage.__dict__) if self.usage is not None else None,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Job:
        try:
            error = data["error"]
            outputs = data["outputs"]
            return cls(
                id=data["id"],
                model=data["model"],
                version=data["version"],
                status=data["status"],
                priority=data["priority"],
                attempts=data["attempts"],
                created_at=datetime.fromisoformat(data["created_at"]),
                started_at=_datetime(data["started_at"]),
                finished_at=_datetime(data["finished_at"]),
                error=JobError(error["code"], error["message"]) if error else None,
                outputs=(
                    {
                        name: decode_tensor(value)
                        for name, value in outputs.items()
                        if not is_reference(value)
                    }
                    if outputs is not None
                    else None
                ),
                references=_references(outputs),
                worker=data.get("worker"),
                progress=_progress(data.get("progress")),
                cached=bool(data.get("cached", False)),
                deadline_at=_datetime(data.get("deadline_at")),  # absent from an older API
                queue_timeout_at=_datetime(data.get("queue_timeout_at")),  # likewise
                queue_position=data.get("queue_position"),  # absent from an older API
                eta_s=data.get("eta_s"),
                usage=Usage.from_wire(data.get("usage")),  # absent from an older API
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"not a job: {exc!r} in {str(data)[:200]}") from None


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: list[int] | None  # -1 marks a free dimension; the first is the batch


@dataclass(frozen=True)
class ModelInfo:
    """A registered model version and its signature."""

    name: str
    version: int
    format: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    config: dict[str, Any]
    registered_at: datetime | None

    @classmethod
    def from_wire(cls, data: Any) -> ModelInfo:
        try:
            return cls(
                name=data["name"],
                version=data["version"],
                format=data.get("format", ""),
                inputs={
                    n: TensorSpec(s["dtype"], s.get("shape")) for n, s in data["inputs"].items()
                },
                outputs={
                    n: TensorSpec(s["dtype"], s.get("shape")) for n, s in data["outputs"].items()
                },
                config=data.get("config") or {},
                registered_at=_datetime(data.get("registered_at")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"not a model: {exc!r} in {str(data)[:200]}") from None


def encode_inputs(inputs: Any) -> Any:
    """The wire form of `inputs`: arrays become binary envelopes, lists and envelopes pass as is.

    An array keeps its dtype: the API casts float64 (and narrower numbers that fit exactly) to
    a float input where every value fits, and refuses other dtypes than the signature's; the
    first float64 array sent warns once, as it doubles the bytes. Nested lists are cast by the
    API. An array of strings (str, bytes, or objects holding them) becomes nested lists of
    strings, with `{"b64": ...}` for bytes that are not UTF-8.
    """
    if isinstance(inputs, Mapping) and not is_envelope(inputs):
        return {name: _encode_tensor(value) for name, value in inputs.items()}
    return _encode_tensor(inputs)


def binary_inputs(inputs: Any) -> tuple[bytes, str] | None:
    """`inputs` as a binary body and its Content-Type: an .npz of named arrays, or an .npy of a
    bare one, written with one copy of their bytes. None (send JSON) unless every input is a
    NumPy array of a fixed-width dtype and together they hold BINARY_BODY_MIN_BYTES or more."""
    if isinstance(inputs, np.ndarray):
        arrays = [inputs]
    elif (
        isinstance(inputs, Mapping)
        and inputs
        and all(isinstance(n, str) and isinstance(v, np.ndarray) for n, v in inputs.items())
    ):
        arrays = list(inputs.values())
    else:
        return None  # lists, envelopes: as they are, in JSON
    if any(a.dtype.name not in tensors.DTYPES for a in arrays):
        return None  # strings (and dtypes the API would refuse: it says why, in JSON)
    for array in arrays:
        _note_dtype(array)
    if sum(a.nbytes for a in arrays) < BINARY_BODY_MIN_BYTES:
        return None
    if isinstance(inputs, np.ndarray):
        return tensors.write_npy(inputs), tensors.NPY
    return tensors.write_npz(inputs), tensors.NPZ


def _note_dtype(array: np.ndarray) -> None:
    """Warn, once a process, of a float64 array: NumPy's default (`np.random.rand`), while models
    mostly take float32. The API casts it where every value fits: it works, at twice the bytes."""
    global _float64_warned
    if array.dtype.name != "float64" or _float64_warned:
        return
    _float64_warned = True
    warnings.warn(
        "tffleet: sending a float64 array; the API casts it to the model's float32 input where "
        "every value fits (422 where one does not). Send .astype(np.float32) to halve the bytes; "
        "this warning is given once per process.",
        UserWarning,
        stacklevel=2,
    )


def _encode_tensor(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        _note_dtype(value)
        return tensors.encode(value, encoding="json" if tensors.is_string(value) else "b64")
    if isinstance(value, tuple):
        return np.asarray(value).tolist()
    return value  # lists, envelopes; the API names anything else it cannot read


def is_envelope(value: Mapping[str, Any]) -> bool:
    return set(value) == {"b64", "dtype", "shape"} and isinstance(value.get("b64"), str)


def is_reference(value: Any) -> bool:
    """Whether an output off the wire is a reference (`{"uri", "dtype", "shape"}`)."""
    return isinstance(value, Mapping) and isinstance(value.get("uri"), str)


def _references(outputs: Any) -> dict[str, OutputRef] | None:
    if outputs is None:
        return None
    found = {
        name: OutputRef(str(value["uri"]), str(value["dtype"]), tuple(value["shape"]))
        for name, value in outputs.items()
        if is_reference(value)
    }
    return found or None


def decode_tensor(value: Any) -> np.ndarray:
    """An output off the wire, as a (writable) array: an envelope keeps its dtype, and strings
    become an object array of bytes, as TensorFlow's `.numpy()` gives them. An array (read from
    an .npz answer, already the caller's own) is returned as it is."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Mapping):
        dtype = value.get("dtype")
        if dtype not in tensors.DTYPES:
            raise ProtocolError(f"output of unsupported dtype {dtype!r}")
        try:
            return tensors.decode(value, dtype=dtype).copy()
        except tensors.TensorError as exc:
            raise ProtocolError(f"output is not a valid tensor: {exc}") from None
    if isinstance(_first_element(value), str | Mapping):
        try:
            return tensors.decode(value, dtype=tensors.STRING)
        except tensors.TensorError as exc:
            raise ProtocolError(f"output is not a valid tensor: {exc}") from None
    return np.asarray(value)


def _first_element(value: Any) -> Any:
    while isinstance(value, list) and value:
        value = value[0]
    return value


def _progress(value: Any) -> tuple[int, int] | None:
    """(samples done, samples) from the wire; None where the API says none (or predates it)."""
    if value is None:
        return None
    return int(value["samples_done"]), int(value["samples"])


def _datetime(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None
