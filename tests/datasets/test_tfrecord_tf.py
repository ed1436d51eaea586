"""TensorFlow, where it is installed, agrees with the TF-free TFRecord layer: it reads the frames
and Examples written here, and what it writes is indexed and decoded here the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.datasets import files
from tffleet.datasets import formats
from tffleet.datasets.base import Column
from tffleet.datasets.locations import Location
from tffleet.objectstore import open_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tf():  # type: ignore[no-untyped-def]
    return pytest.importorskip("tensorflow")


def test_tensorflow_reads_what_is_framed_here(tf, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ours.tfrecord"
    path.write_bytes(files.tfrecord(files.examples(20)))
    spec = {"x": tf.io.FixedLenFeature([48], tf.float32), "id": tf.io.FixedLenFeature([], tf.int64)}
    # TF checks every CRC as it reads (the records' too, which the layer here does not).
    dataset = tf.data.TFRecordDataset(str(path)).map(lambda r: tf.io.parse_single_example(r, spec))
    got = list(dataset.as_numpy_iterator())
    assert [int(e["id"]) for e in got] == list(range(20))
    np.testing.assert_allclose(got[7]["x"], files.images(1)[0].ravel() + 7)


def test_what_tensorflow_writes_is_indexed_and_decoded(tf, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "theirs.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(1500):
            feature = {
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i + 0.5, i + 0.25])),
                "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"k{i}".encode()])),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    where = Location(open_store(tmp_path.as_uri()), "theirs.tfrecord", path.as_uri())
    info = formats.inspect(where, "tfrecord")
    assert info.records == 1500
    assert info.schema == {"x": Column("float32", (3,)), "key": Column("string", (1,))}
    batches = list(formats.read(where, "tfrecord", 1200, 1300, ["x"], 64, key="key", info=info))
    xs = np.concatenate([b.columns["x"] for b in batches])
    np.testing.assert_allclose(xs[:, 0], np.arange(1200, 1300))
    assert np.concatenate([b.keys for b in batches])[-1][0] == b"k1299"
