"""TensorFlow lives here, and only here: load a model once per child, warm it up, run batches.

One interface, `Runtime` (base.py): `format`, `inputs` and `outputs` (the signature the API
validates against), `run(batch) -> outputs`, `warm_up(bucket sizes)` and `close()`; one
implementation per format the repository tells apart:

    saved_model    SavedModelRuntime (saved_model.py): a TF2 SavedModel's signature
    keras          KerasRuntime (keras_model.py): a Keras v3 `.keras` file
    frozen_graph   FrozenGraphRuntime (frozen_graph.py): a TF1 GraphDef in its own Session

Imported by a worker child only, after it pinned its device (worker/child.py).
"""

from __future__ import annotations

import tensorflow as tf

from worker.repository import FORMATS, ModelSpec
from worker.runtime.base import Runtime
from worker.runtime.frozen_graph import FrozenGraphRuntime
from worker.runtime.keras_model import KerasRuntime
from worker.runtime.saved_model import SavedModelRuntime

__all__ = ["Runtime", "configure_threads", "load", "visible_devices"]

_RUNTIMES: dict[str, type[Runtime]] = {
    "saved_model": SavedModelRuntime,
    "keras": KerasRuntime,
    "frozen_graph": FrozenGraphRuntime,
}


def configure_threads(*, intra_op: int, inter_op: int = 1) -> None:
    """CPU threads for every model of this child (frozen graphs' sessions read them too)."""
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)


def load(spec: ModelSpec) -> Runtime:
    """Load one model version; raises ValueError naming the path and what is wrong."""
    runtime = _RUNTIMES.get(spec.format)
    if runtime is None:
        raise ValueError(f"{spec.path}: unknown format {spec.format!r}; known: {list(FORMATS)}")
    return runtime(spec)


def visible_devices() -> list[str]:
    return [d.name for d in tf.config.list_logical_devices()]
