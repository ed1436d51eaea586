"""A batch's arrays handed to TensorFlow: without a copy where the memory allows it.

`tf.constant` copies every array into a tensor of its own: 3.4 ms of the task's thread per
12.6 MB batch, most of what a job by reference cost the worker beyond the forward pass. An
array that is C-ordered, of the input's dtype, 64-byte aligned (as TensorFlow's kernels want
their buffers) and whose memory may be written underneath is handed over by DLPack instead,
and the tensor is a view of it: a directory store's mapped object (a private, copy-on-write
map: tffleet/objectstore/files.py, its .npy data 64-byte aligned), or a batch joined from
several jobs (into aligned memory: worker/pipeline.py). Anything else, an S3 object's buffer
or an inline input (read-only bytes), an array off alignment, is copied by `tf.constant`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# Below this an array is copied: a copy costs less than the hand-over's calls.
VIEW_MIN_BYTES = 64 * 1024
_ALIGN = 64  # EIGEN_MAX_ALIGN_BYTES


def as_tensor(array: np.ndarray, dtype: str) -> tf.Tensor:
    """`array` as a tensor of `dtype`: a view of its memory where it can be, else a copy."""
    if (
        array.nbytes >= VIEW_MIN_BYTES
        and array.dtype.name == dtype  # never a string (object) tensor's
        and array.flags.c_contiguous
        and array.ctypes.data % _ALIGN == 0
    ):
        view = array.view()
        try:
            # Refused (ValueError) where the memory underneath is read-only; the arrays a job's
            # inputs are read as are marked read-only only for the code that reads them.
            view.flags.writeable = True
            return tf.experimental.dlpack.from_dlpack(view.__dlpack__())
        except (ValueError, BufferError, TypeError, tf.errors.InvalidArgumentError):
            pass
    return tf.constant(array, dtype=dtype)
