"""TensorFlow lives here, and only here: load a model once per child, warm it up, run batches."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import tensorflow as tf

from worker.repository import ModelSpec

log = logging.getLogger(__name__)


def _spec(tensor_spec: tf.TensorSpec) -> dict[str, Any]:
    shape = tensor_spec.shape
    dims = (
        [-1 if d is None else int(d) for d in shape.as_list()] if shape.rank is not None else None
    )
    return {"dtype": tensor_spec.dtype.name, "shape": dims}


class SavedModelRuntime:
    """A TF2 SavedModel signature, called directly (never `model.predict` in a loop)."""

    format = "saved_model"

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._loaded = tf.saved_model.load(str(spec.path))
        try:
            self._fn = self._loaded.signatures[spec.config.signature]
        except KeyError:
            names = sorted(self._loaded.signatures.keys())
            raise ValueError(
                f"{spec.path}: no signature {spec.config.signature!r}; it has {names}"
            ) from None
        _, kwargs = self._fn.structured_input_signature
        self.inputs = {name: _spec(s) for name, s in sorted(kwargs.items())}
        self.outputs = {name: _spec(s) for name, s in sorted(self._fn.structured_outputs.items())}

    def run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self._fn(**{name: tf.constant(batch[name]) for name in self.inputs})
        return {name: value.numpy() for name, value in result.items()}

    def warm_up(self, sizes: tuple[int, ...]) -> float:
        """Run every padded batch size once, so no request pays for tracing or allocation.

        Skipped when an input has a free dimension besides the batch: no shape would be right.
        """
        shapes = {name: spec["shape"] for name, spec in self.inputs.items()}
        if any(shape is None or -1 in shape[1:] for shape in shapes.values()):
            log.info("%s: inputs have free dimensions; no warm-up", self.spec.path)
            return 0.0
        started = time.perf_counter()
        for size in sizes:
            self.run(
                {
                    name: np.zeros([size, *shapes[name][1:]], dtype=spec["dtype"])
                    for name, spec in self.inputs.items()
                }
            )
        return time.perf_counter() - started


def configure_threads(*, intra_op: int, inter_op: int = 1) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)


def load(spec: ModelSpec) -> SavedModelRuntime:
    if spec.format != "saved_model":
        raise ValueError(f"{spec.path}: format {spec.format!r} is not supported yet")
    return SavedModelRuntime(spec)


def visible_devices() -> list[str]:
    return [d.name for d in tf.config.list_logical_devices()]
