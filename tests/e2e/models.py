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


# The faulty model's controls, in each sample's first two features.
SLEEP_COLUMN = 0  # the forward pass sleeps for the largest value in this column, in seconds
KILL_COLUMN = 1  # a sample holding KILL_VALUE here aborts the process (SIGABRT)
KILL_VALUE = 13.0


def build_faulty(
    repository: Path, *, name: str = "faulty", version: int = 1, timeout_s: float | None = None
) -> np.ndarray:
    """y = x @ W for x of 4 floats, with two faults driven by the input, for fault tests:

    - the forward pass sleeps max(x[:, SLEEP_COLUMN]) seconds (none for values up to 0): a slow
      job, that holds its device without using a CPU;
    - a sample with x[:, KILL_COLUMN] == KILL_VALUE aborts the process, as a crash in a kernel
      would: a poison job.

    Both are graph ops, so they survive the SavedModel (a `tf.py_function` would not). Writes a
    model.toml with `timeout_s` when given. Returns W.
    """
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops.testing import sleep

    weights = np.arange(8, dtype=np.float32).reshape(4, 2) - 3.5

    class Faulty(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            seconds = tf.reduce_max(tf.concat([x[:, SLEEP_COLUMN], [0.0]], axis=0))
            # The sleep dataset sleeps before each element and before its end: halve it.
            micros = tf.cast(tf.clip_by_value(seconds, 0.0, 3600.0) * 5e5, tf.int64)
            slept = tf.data.Dataset.from_tensors(x).apply(sleep(micros)).get_single_element()

            def abort() -> tf.Tensor:
                crash = tf.raw_ops.Abort(error_msg="poison job", exit_without_error=False)
                with tf.control_dependencies([crash]):
                    return tf.identity(slept)

            poisoned = tf.reduce_any(tf.equal(x[:, KILL_COLUMN], KILL_VALUE))
            checked = tf.cond(poisoned, abort, lambda: tf.identity(slept))
            return {"y": tf.matmul(checked, self.w)}

    module = Faulty()
    model_dir = repository / name
    tf.saved_model.save(
        module, str(model_dir / str(version)), signatures={"serving_default": module.serve}
    )
    if timeout_s is not None:
        (model_dir / "model.toml").write_text(f"timeout_s = {timeout_s}\n")
    return weights
