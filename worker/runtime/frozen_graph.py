"""A TF1 frozen GraphDef (`model.pb`), run by one tf.compat.v1.Session kept for its life.

A GraphDef has no signature: model.toml's [inputs] and [outputs] tables name its tensors (the
name clients use = the graph's tensor name, "input:0"); their dtypes and shapes come from the
graph. Without them loading fails with a message that lists the graph's placeholders and the
tensors no op consumes, the likely outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from worker.repository import CONFIG_FILE, FROZEN_GRAPH_FILE, ModelSpec
from worker.runtime.base import Runtime, first_line, tensor_spec

# Ops that are never a model's output, though nothing consumes them.
_NOT_OUTPUTS = frozenset({"NoOp", "Const", "Placeholder", "Assert"})
_LISTED = 20


def _spec(tensor: tf.Tensor) -> dict[str, Any]:
    shape = tensor.shape.as_list() if tensor.shape.rank is not None else None
    return tensor_spec(tensor.dtype.name, shape)


def describe(graph: tf.Graph) -> str:
    """The graph's placeholders and likely outputs, for a user writing its model.toml."""
    ops = graph.get_operations()
    consumed = {t.op.name for op in ops for t in op.inputs} | {
        c.name for op in ops for c in op.control_inputs
    }
    placeholders = [op.outputs[0] for op in ops if op.type == "Placeholder"]
    outputs = [
        op.outputs[0]
        for op in ops
        if op.outputs and op.name not in consumed and op.type not in _NOT_OUTPUTS
    ]

    def listed(found: list[tf.Tensor]) -> str:
        shown = [f"{t.name} ({t.dtype.name}, {t.shape})" for t in found[:_LISTED]]
        if len(found) > _LISTED:
            shown.append(f"and {len(found) - _LISTED} more")
        return ", ".join(shown) or "none"

    return f"its placeholders: {listed(placeholders)}; likely outputs: {listed(outputs)}"


class FrozenGraphRuntime(Runtime):
    format = "frozen_graph"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        file = spec.path / FROZEN_GRAPH_FILE
        graph_def = tf.compat.v1.GraphDef()
        graph = tf.Graph()
        try:
            graph_def.ParseFromString(file.read_bytes())
            # Devices recorded where the graph was frozen ("/device:GPU:1") may not exist in
            # this child, which sees its own GPU only: let TensorFlow place every op here.
            for node in graph_def.node:
                node.device = ""
            with graph.as_default():
                tf.import_graph_def(graph_def, name="")
        except Exception as exc:
            raise ValueError(f"{file}: not a loadable frozen GraphDef ({first_line(exc)})") from exc
        config = spec.config
        if not config.inputs or not config.outputs:
            raise ValueError(
                f"{file}: a frozen graph needs its tensors named in {CONFIG_FILE}, tables [inputs] "
                f'and [outputs] of name = "tensor:0"; {describe(graph)}'
            )
        feeds = self._tensors(graph, "inputs", config.inputs)
        fetches = self._tensors(graph, "outputs", config.outputs)
        self.inputs = {name: _spec(t) for name, t in sorted(feeds.items())}
        self.outputs = {name: _spec(t) for name, t in sorted(fetches.items())}
        self.check_signature()
        self._feeds, self._fetches = feeds, fetches
        threads = tf.config.threading  # as configure_threads set them for this child
        session_config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=threads.get_intra_op_parallelism_threads(),
            inter_op_parallelism_threads=threads.get_inter_op_parallelism_threads(),
            allow_soft_placement=True,  # ops without a GPU kernel run on the CPU, as in TF2
        )
        session_config.gpu_options.allow_growth = True
        self._session = tf.compat.v1.Session(graph=graph, config=session_config)

    def _tensors(
        self, graph: tf.Graph, table: str, names: Mapping[str, str]
    ) -> dict[str, tf.Tensor]:
        found = {}
        for name, tensor_name in names.items():
            try:
                found[name] = graph.get_tensor_by_name(tensor_name)
            except (KeyError, ValueError) as exc:
                raise ValueError(
                    f"{self.spec.path / FROZEN_GRAPH_FILE}: [{table}] {name} = {tensor_name!r}: "
                    f"{exc.args[0] if exc.args else exc}; {describe(graph)}"
                ) from None
        return found

    def _forward(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {tensor: batch[name] for name, tensor in self._feeds.items()}
        out: dict[str, np.ndarray] = self._session.run(self._fetches, feed_dict=feed)
        return out

    def _release(self) -> None:
        self._session.close()
        del self._session, self._feeds, self._fetches
