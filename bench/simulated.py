"""A simulated device: a real TF2 SavedModel whose forward pass holds its "device" for a fixed
wall time per batch, without using a CPU.

    .venv/bin/python -m bench.simulated REPOSITORY --device-s 0.5 --max-batch-size 16

builds `REPOSITORY/sim/1` (y = 2x, x of 4 floats) with its model.toml, loads it back as a worker
child would, and prints one JSON line: the wall and CPU time of a forward pass at full batch.

The wait is a graph op, so it is in the SavedModel and runs in any process that loads it:
`SleepDataset` (tf.data's test transformation) sleeps before every element it is asked for,
and `get_single_element` asks twice (the element, then the end of the sequence), so each half
sleeps `device_s / 2`. The thread blocks in a timed sleep: the CPU is free meanwhile, as it
is while a GPU runs a kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

MODEL = "sim"
WIDTH = 4


def build(repository: Path, *, device_s: float, max_batch_size: int) -> Path:
    """Write the SavedModel and its model.toml; returns the version directory."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops.testing import sleep

    half_us = round(device_s * 1e6 / 2)

    class Simulated(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            waited = tf.data.Dataset.from_tensors(x).apply(sleep(half_us)).get_single_element()
            return {"y": waited * 2.0}

    module = Simulated()
    path = repository / MODEL / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    # One bucket (the full batch): every forward pass, padded or not, takes the same device time,
    # and the warm-up runs one pass instead of one per power of two.
    (repository / MODEL / "model.toml").write_text(
        f"max_batch_size = {max_batch_size}\nbuckets = [{max_batch_size}]\n"
    )
    return path


def calibrate(path: Path, *, batch: int, calls: int = 3) -> dict[str, float]:
    """Load the SavedModel as a worker child does and time `calls` forward passes: wall and
    this process's CPU (user + system) per call, after one warm-up call."""
    import numpy as np
    import tensorflow as tf

    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    x = tf.constant(np.ones((batch, WIDTH), np.float32))
    out = fn(x=x)["y"].numpy()
    if out.shape != (batch, WIDTH) or not np.all(out == 2.0):
        raise RuntimeError(f"the simulated model computed {out!r}")

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    cpu_started, started = cpu(), time.perf_counter()
    for _ in range(calls):
        fn(x=x)["y"].numpy()
    wall, used = time.perf_counter() - started, cpu() - cpu_started
    return {"wall_s": wall / calls, "cpu_s": used / calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repository", type=Path)
    parser.add_argument("--device-s", type=float, default=0.5, help="device time per batch")
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # as a worker child with no cores
    tf.config.threading.set_inter_op_parallelism_threads(1)
    path = build(args.repository, device_s=args.device_s, max_batch_size=args.max_batch_size)
    print(json.dumps(calibrate(path, batch=args.max_batch_size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
