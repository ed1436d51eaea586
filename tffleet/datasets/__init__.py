"""Datasets of transforms (DESIGN §14), without TensorFlow: the API inspects and checks them, the
worker reads and writes them.

- `locations`: which URIs a transform may read and write (`resolve`, `expand`).
- `formats`: `inspect` a file (records, schema, an index of offsets) and `read` a shard of it in
  batches, per format (`parquet`, `tfrecord`, `text` for CSV and JSON Lines, `npy`).
- `writers`: one output part written whole or not at all, and the errors file.
- `mapping`: which column feeds which model input, checked against the signature.

This package's own `__init__` imports nothing, so settings can check a location without
loading pyarrow.
"""
