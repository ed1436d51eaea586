"""The example model `tffleet up` serves when the repository is empty (built here, not downloaded).

python -m worker.example MODEL_REPOSITORY
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

EXAMPLE_NAME = "example"
INPUT_SIZE = 4
OUTPUT_SIZE = 3


def build(repository: Path, *, name: str = EXAMPLE_NAME, version: int = 1, seed: int = 0) -> Path:
    """A small Keras MLP (input `x` of 4 floats, output `y` of 3), exported as a SavedModel."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(INPUT_SIZE,), name="x")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = keras.layers.Dense(OUTPUT_SIZE, name="y")(hidden)
    model = keras.Model(inputs, outputs)
    path = repository / name / str(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.export(str(path), format="tf_saved_model", verbose=False)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m worker.example MODEL_REPOSITORY")
    from tffleet.devices import CPU_ONLY_ENVIRONMENT

    # A model this small needs no GPU, and no CUDA probe that logs an error where there is none.
    for name, value in CPU_ONLY_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    print(build(Path(sys.argv[1])))
