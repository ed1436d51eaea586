"""Small models of every format and dtype the runtimes serve, built by the tests (fixed seeds,
nothing downloaded). Each builder writes `<repository>/<name>/<version>/` and returns what the
test calls in TensorFlow to know the expected outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

VOCABULARY = ["zero", "one", "two", "three"]


def build_mixed(repository: Path, *, name: str = "mixed", version: int = 1) -> Any:
    """A SavedModel whose `predict` signature (named in model.toml; `serving_default` is another)
    takes x (float32, 3 wide), k (int64) and flag (bool) and returns

        y = x @ W (float32), k2 = 2k + flag (int64), negative = any(x < 0) (bool),
        kept = where(flag, sum(x), 0) (float32).

    Returns the module: `module.predict(x=..., k=..., flag=...)`.
    """
    import tensorflow as tf

    weights = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5

    class Mixed(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 3], tf.float32, name="x"),
                tf.TensorSpec([None], tf.int64, name="k"),
                tf.TensorSpec([None], tf.bool, name="flag"),
            ]
        )
        def predict(self, x: tf.Tensor, k: tf.Tensor, flag: tf.Tensor) -> dict[str, tf.Tensor]:
            return {
                "y": tf.matmul(x, self.w),
                "k2": 2 * k + tf.cast(flag, tf.int64),
                "negative": tf.reduce_any(x < 0, axis=1),
                "kept": tf.where(flag, tf.reduce_sum(x, axis=1), 0.0),
            }

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": tf.matmul(x, self.w)}

    module = Mixed()
    model_dir = repository / name
    tf.saved_model.save(
        module,
        str(model_dir / str(version)),
        signatures={"serving_default": module.serve, "predict": module.predict},
    )
    (model_dir / "model.toml").write_text('signature = "predict"\nmax_batch_size = 8\n')
    return module


def build_text(repository: Path, *, name: str = "text", version: int = 1) -> Any:
    """A SavedModel of strings: text (string) -> chars (int32, UTF-8 characters), id (int64, the
    text's index in VOCABULARY or -1, by a lookup table), upper (string) and head (string, the
    first byte: not UTF-8 for "é"). Returns the module: `module.serve(text=...)`."""
    import tensorflow as tf

    class Text(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(VOCABULARY), tf.range(len(VOCABULARY), dtype=tf.int64)
                ),
                default_value=-1,
            )

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
            return {
                "chars": tf.strings.length(text, unit="UTF8_CHAR"),
                "id": self.table.lookup(text),
                "upper": tf.strings.upper(text),
                "head": tf.strings.substr(text, 0, 1),
            }

    module = Text()
    model_dir = repository / name
    tf.saved_model.save(
        module, str(model_dir / str(version)), signatures={"serving_default": module.serve}
    )
    (model_dir / "model.toml").write_text("max_batch_size = 8\n")
    return module


def build_keras_file(repository: Path, *, name: str = "kfile", version: int = 1) -> Any:
    """A functional Keras model saved as a .keras file: a dict of inputs a (float32, 3 wide) and
    b (int32, 2 wide), and a list of two outputs named by their layers, `scores` (2 wide) and
    `probability` (1 wide). Returns the model."""
    import keras

    keras.utils.set_random_seed(3)
    a = keras.Input(shape=(3,), name="a")
    b = keras.Input(shape=(2,), name="b", dtype="int32")
    hidden = keras.layers.Dense(4, activation="relu")(
        keras.layers.Concatenate()([a, keras.ops.cast(b, "float32")])
    )
    scores = keras.layers.Dense(2, name="scores")(hidden)
    probability = keras.layers.Dense(1, activation="sigmoid", name="probability")(hidden)
    model = keras.Model({"a": a, "b": b}, [scores, probability])
    model_dir = repository / name / str(version)
    model_dir.mkdir(parents=True)
    model.save(model_dir / "model.keras")
    (repository / name / "model.toml").write_text("max_batch_size = 8\n")
    return model


def build_frozen_graph(repository: Path, *, name: str = "frozen", version: int = 1) -> Any:
    """A TF1-style frozen GraphDef (model.pb, variables folded into constants) with tensors
    image:0 (float32, 4 wide), words:0 (string), probabilities:0 (softmax of image @ W + b) and
    lengths:0 (the words' byte lengths), and a model.toml naming them. Returns the tf.function
    it was frozen from: `serve(image, words) -> (probabilities, lengths)`."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    weights = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    bias = tf.Variable(np.array([0.5, -0.5, 0.0], dtype=np.float32))

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 4], tf.float32, name="image"),
            tf.TensorSpec([None], tf.string, name="words"),
        ]
    )
    def serve(image: tf.Tensor, words: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        logits = tf.matmul(image, weights) + bias
        return tf.nn.softmax(logits, name="probabilities"), tf.strings.length(words, name="lengths")

    frozen = convert_variables_to_constants_v2(serve.get_concrete_function())
    model_dir = repository / name
    tf.io.write_graph(
        frozen.graph.as_graph_def(), str(model_dir / str(version)), "model.pb", as_text=False
    )
    (model_dir / "model.toml").write_text(
        "max_batch_size = 8\n"
        '[inputs]\nimage = "image:0"\nwords = "words:0"\n'
        '[outputs]\nprobabilities = "probabilities:0"\nlengths = "lengths:0"\n'
    )
    return serve


def write_corrupt(repository: Path, *, name: str = "broken", version: int = 1) -> Path:
    """A version directory whose saved_model.pb is not a SavedModel; returns the directory."""
    path = repository / name / str(version)
    path.mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(b"not a protocol buffer \x00\xff")
    return path
