"""Small models built by the tests (fixed seeds; nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def build_mlp(repository: Path, *, name: str = "mlp", version: int = 1, seed: int = 7) -> Any:
    """A Keras MLP (x: 8 floats -> 16 relu -> 3), exported as a SavedModel; returns the model."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(8,), name="x")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.export(str(repository / name / str(version)), format="tf_saved_model", verbose=False)
    return model


def build_free_matmul(repository: Path, *, name: str = "matmul", version: int = 1) -> np.ndarray:
    """x @ W with W of shape (4, 2), but x's second dimension left free in the signature:
    an input of width 5 passes validation and then makes TensorFlow raise."""
    import tensorflow as tf

    weights = np.arange(8, dtype=np.float32).reshape(4, 2)

    class MatMul(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": tf.matmul(x, self.w)}

    module = MatMul()
    tf.saved_model.save(
        module, str(repository / name / str(version)), signatures={"serving_default": module.serve}
    )
    return weights
