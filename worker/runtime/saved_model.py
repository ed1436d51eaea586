"""A TF2 SavedModel: one of its signatures, called directly (never `model.predict` in a loop)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from worker.repository import ModelSpec
from worker.runtime.base import Runtime, first_line, tensor_spec
from worker.runtime.feed import as_tensor


def _spec(spec: tf.TensorSpec) -> dict[str, Any]:
    shape = spec.shape.as_list() if spec.shape.rank is not None else None
    return tensor_spec(spec.dtype.name, shape)


class SavedModelRuntime(Runtime):
    """The signature model.toml names (`serving_default` unless set), with its named inputs and
    outputs of any dtype tffleet carries."""

    format = "saved_model"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        try:
            self._loaded = tf.saved_model.load(str(spec.path))
        except Exception as exc:
            raise ValueError(f"{spec.path}: not a loadable SavedModel ({first_line(exc)})") from exc
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
        self.check_signature()

    def _forward(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self._fn(
            **{name: as_tensor(batch[name], s["dtype"]) for name, s in self.inputs.items()}
        )
        return {name: value.numpy() for name, value in result.items()}

    def _release(self) -> None:
        del self._fn, self._loaded
