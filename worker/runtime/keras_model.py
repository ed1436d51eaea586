"""A Keras v3 `.keras` file, called directly inside one tf.function (never `model.predict`).

Inputs are named as the model names them: a dict of inputs by its keys, otherwise by each
`keras.Input(name=...)`. Outputs: a dict by its keys; several outputs by their layers' names
(`model.output_names`); a single output is `output_0`, as `model.export` names it in a
SavedModel, so moving a model between the two formats keeps its output's name.
"""

from __future__ import annotations

import zipfile
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from worker.repository import ModelSpec
from worker.runtime.base import Runtime, first_line, tensor_spec
from worker.runtime.feed import as_tensor

SINGLE_OUTPUT = "output_0"


def _structure(model: Any, which: str) -> Any:
    """The model's inputs or outputs as it was built with them: a dict, a list, or one tensor.

    A Sequential model has only the flat list (`model.inputs`); a subclassed one has neither.
    """
    try:
        return getattr(model, which)
    except AttributeError:
        flat = getattr(model, f"{which}s", None)
    if not flat:
        raise ValueError(
            f"the model records no {which}s (a subclassed model?); save a functional or "
            "Sequential model, or export a SavedModel with model.export(path)"
        )
    return flat[0] if len(flat) == 1 else list(flat)


def _output_names(model: Any, outputs: Any) -> list[str]:
    """Names for the outputs in tf.nest.flatten order (a dict's: its sorted keys)."""
    if isinstance(outputs, dict):
        return sorted(outputs)
    flat = tf.nest.flatten(outputs)
    if len(flat) == 1:
        return [SINGLE_OUTPUT]
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != len(flat) or len(set(names)) != len(names):
        names = [f"output_{i}" for i in range(len(flat))]
    return names


def _spec(tensor: Any) -> dict[str, Any]:
    return tensor_spec(str(tensor.dtype), tensor.shape)


class KerasRuntime(Runtime):
    format = "keras"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        files = sorted(spec.path.glob("*.keras"))
        if len(files) != 1:
            raise ValueError(
                f"{spec.path}: expected one .keras file, found {[f.name for f in files] or 'none'}"
            )
        (file,) = files
        if not zipfile.is_zipfile(file):
            raise ValueError(f"{file}: not a .keras file (a .keras file is a zip archive)")
        try:
            self._model = keras.saving.load_model(file, compile=False)
        except Exception as exc:
            raise ValueError(f"{file}: not a loadable Keras model ({first_line(exc)})") from exc
        try:
            inputs = _structure(self._model, "input")
            outputs = _structure(self._model, "output")
        except ValueError as exc:
            raise ValueError(f"{file}: {exc}") from None
        # The inputs' structure with the names clients use as leaves, to build each call's.
        self._input_names = (
            {key: key for key in inputs}
            if isinstance(inputs, dict)
            else tf.nest.map_structure(lambda t: t.name, inputs)
        )
        self.inputs = {
            name: _spec(t)
            for name, t in sorted(
                zip(tf.nest.flatten(self._input_names), tf.nest.flatten(inputs), strict=True)
            )
        }
        self._output_names = _output_names(self._model, outputs)
        self.outputs = {
            name: _spec(t)
            for name, t in sorted(zip(self._output_names, tf.nest.flatten(outputs), strict=True))
        }
        self.check_signature()
        model = self._model
        signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), inputs)

        @tf.function(input_signature=[signature])
        def call(features: Any) -> Any:
            return model(features, training=False)

        self._call = call

    def _forward(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        features = tf.nest.map_structure(
            lambda name: as_tensor(batch[name], self.inputs[name]["dtype"]),
            self._input_names,
        )
        result = tf.nest.flatten(self._call(features))
        return {name: value.numpy() for name, value in zip(self._output_names, result, strict=True)}

    def _release(self) -> None:
        del self._call, self._model
