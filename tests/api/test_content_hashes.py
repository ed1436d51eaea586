"""A job's content hash is computed only where something reads it (api/references.py): the
request hash of a keyed request, the cache key of a model whose response cache is on."""

from __future__ import annotations

import numpy as np

from api import references
from tffleet import tensors

BIG = np.arange(100_000, dtype=np.float32)  # 400 KB: over an inline limit of 1 KiB


def packed(hashed: bool) -> references.Packed:
    return references.pack(
        {"x": BIG},
        {},
        tenant="acme",
        job_id="j1",
        inline_max_bytes=1024,
        staged=references.Staged(),
        hashed=hashed,
    )


def test_only_a_key_or_a_caching_model_reads_the_hashes() -> None:
    plain = {"name": "mlp", "config": {}}
    caching = {"name": "mlp", "config": {"cache": True}}
    assert not references.hashes_read(plain, keyed=False)
    assert references.hashes_read(plain, keyed=True)
    assert references.hashes_read(caching, keyed=False)
    assert not references.hashes_read({"name": "mlp"}, keyed=False)  # no config at all


def test_an_input_not_hashed_is_stored_the_same_without_content() -> None:
    hashed, not_hashed = packed(True), packed(False)
    assert hashed.content is not None and not_hashed.content is None
    assert not_hashed.blob == hashed.blob  # the same reference to the same object
    assert not_hashed.stored_bytes == hashed.stored_bytes
    assert list(tensors.references(not_hashed.blob)) == ["x"]


def test_a_streamed_body_not_hashed_leaves_its_job_without_content() -> None:
    reference = tensors.Reference(
        key="acme/jobs/j1/inputs/x.npy", dtype="float32", shape=(4,), offset=128, nbytes=16
    )
    streamed = {"x": references.Named(None, reference, size=144, digest=None)}
    found = references.pack(
        {}, streamed, tenant="acme", job_id="j1", inline_max_bytes=1024, staged=None
    )
    # Its model began caching after the body was streamed: the cache key reads the blob,
    # whose key names the job (a miss), rather than a digest that was never taken.
    assert found.content is None and found.stored_bytes == 144
