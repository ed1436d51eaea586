"""What every format's runtime does the same way: check the signature, warm up, close."""

from __future__ import annotations

import gc
import logging
import time
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from tffleet import tensors
from worker.repository import ModelSpec

log = logging.getLogger(__name__)

# A signature: tensor name -> {"dtype": "float32", "shape": [-1, 1024]}; -1 marks a free
# dimension, and a shape of None a tensor of unknown rank.
Signature = dict[str, dict[str, Any]]


def tensor_spec(dtype: str, shape: Iterable[int | None] | None) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "shape": None if shape is None else [-1 if d is None else int(d) for d in shape],
    }


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


class Runtime(ABC):
    """One model version, loaded once: its signature, batched forward passes, a warm-up.

    A subclass loads its format in `__init__`, sets `inputs` and `outputs`, calls
    `check_signature`, and implements `_forward` and `_release`.
    """

    format: ClassVar[str]
    inputs: Signature
    outputs: Signature
    _closed: bool = False

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One forward pass over a batch of every input (by name, batch first)."""
        if self._closed:
            raise RuntimeError(f"{self.spec.path}: the model was closed")
        return self._forward(batch)

    def close(self) -> None:
        """Release the model (its graph, session and variables); `run` raises from then on."""
        if not self._closed:
            self._closed = True
            self._release()
            gc.collect()  # TensorFlow objects hold reference cycles: free the memory now

    @abstractmethod
    def _forward(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def _release(self) -> None: ...

    def check_signature(self) -> None:
        """Refuse at load what could never take a job, rather than fail every job later."""
        path = self.spec.path
        for kind, signature in (("input", self.inputs), ("output", self.outputs)):
            for name, spec in signature.items():
                if spec["dtype"] not in tensors.SUPPORTED_DTYPES:
                    raise ValueError(
                        f"{path}: {kind} {name!r} has dtype {spec['dtype']}, which tffleet cannot "
                        f"carry (it carries {', '.join(sorted(tensors.SUPPORTED_DTYPES))})"
                    )
        buckets = self.spec.config.bucket_sizes()
        for name, spec in self.inputs.items():
            shape = spec["shape"]
            if shape == []:
                raise ValueError(
                    f"{path}: input {name!r} is a scalar; inputs need a batch dimension"
                )
            if shape and shape[0] != -1 and set(buckets) != {shape[0]}:
                size = shape[0]
                raise ValueError(
                    f"{path}: input {name!r} has a fixed batch size of {size}; set "
                    f"max_batch_size = {size} and buckets = [{size}] in model.toml"
                )

    def warm_up(self, sizes: tuple[int, ...]) -> float:
        """Run every padded batch size once, so no request pays for tracing or allocation.

        With the model's `warmup` file its samples are repeated or cut to each size; without one
        the inputs are zeros (False, empty strings), which is skipped when an input has a free
        dimension besides the batch: no shape would be right.
        """
        samples = self._warmup_samples()
        if samples is None:
            free = sorted(
                name
                for name, spec in self.inputs.items()
                if spec["shape"] is None or -1 in spec["shape"][1:]
            )
            if free:
                log.info(
                    "%s: inputs %s have free dimensions and no warmup file is configured; "
                    "no warm-up",
                    self.spec.path, free,
                )  # fmt: skip
                return 0.0
        started = time.perf_counter()
        for size in sizes:
            if samples is None:
                batch = {name: _zeros(spec, size) for name, spec in self.inputs.items()}
            else:
                batch = {
                    name: np.take(array, np.arange(size) % len(array), axis=0)
                    for name, array in samples.items()
                }
            self.run(batch)
        return time.perf_counter() - started

    def _warmup_samples(self) -> dict[str, np.ndarray] | None:
        """The arrays of the configured warm-up file, in the inputs' dtypes; None without one."""
        if self.spec.config.warmup is None:
            return None
        file = self.spec.path / self.spec.config.warmup
        try:
            with np.load(file, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{file}: cannot read the warm-up file ({first_line(exc)})") from None
        if set(arrays) != set(self.inputs):
            raise ValueError(
                f"{file}: the warm-up file holds arrays {sorted(arrays)}; it needs one per input, "
                f"{sorted(self.inputs)}"
            )
        samples = {}
        for name, array in arrays.items():
            if array.ndim == 0 or len(array) == 0:
                raise ValueError(f"{file}: array {name!r} needs at least one sample, batch first")
            dtype = self.inputs[name]["dtype"]
            try:
                samples[name] = (
                    tensors.as_bytes(array)
                    if dtype == tensors.STRING
                    else array.astype(tensors.DTYPES[dtype])
                )
            except (tensors.TensorError, ValueError, TypeError) as exc:
                raise ValueError(f"{file}: array {name!r} is not {dtype} ({exc})") from None
        return samples


def _zeros(spec: dict[str, Any], size: int) -> np.ndarray:
    shape = [size, *spec["shape"][1:]]
    if spec["dtype"] == tensors.STRING:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=tensors.DTYPES[spec["dtype"]])
