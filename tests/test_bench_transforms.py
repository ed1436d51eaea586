"""bench/transforms.py runs: a smoke test, not a measurement (nothing here asserts a timing).

(1) and (2) run for real with `--quick --skip scaling` (TensorFlow, a private Redis, a `tffleet
api` and worker on SQLite and a file:// store): every transform succeeds and each ratio is
printed beside its target. (3) needs PostgreSQL and two worker hosts for minutes, so its report
is checked on figures made up here; the files the bench writes are read back by the fleet's own
readers.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import transforms
from tffleet.datasets import example, formats, tfrecord
from tffleet.datasets.locations import Location
from tffleet.objectstore import open_store


def _location(path: Path) -> Location:
    return Location(open_store(path.parent.as_uri()), path.name, path.as_uri())


def test_example_bytes_decode_as_the_fleet_reads_them() -> None:
    row = np.random.default_rng(0).random(12, dtype=np.float32)
    decoded = example.decode(transforms.example_bytes({"id": np.array([300]), "image": row}))
    assert decoded["id"].tolist() == [300]
    np.testing.assert_array_equal(decoded["image"], row)


def test_files_hold_the_same_records(tmp_path: Path) -> None:
    """A Parquet file of the bench, and a TFRecord file of the same records framed here (the
    bench frames them with TensorFlow's writer, which this test does not load)."""
    transforms.write_parquet(tmp_path / "x.parquet", "x", 1500, 4)
    with (tmp_path / "x.tfrecord").open("wb") as out:
        for ids, values in transforms._chunks(1500, 4, seed=0):
            for i, row in zip(ids, values, strict=True):
                out.write(tfrecord.frame(transforms.example_bytes({"id": np.array([i]), "x": row})))
    read = {}
    for format in ("parquet", "tfrecord"):
        location = _location(tmp_path / f"x.{format}")
        info = formats.inspect(location, format)
        assert info.records == 1500
        batches = list(formats.read(location, format, 0, 1500, ["id", "x"], 512, info=info))
        read[format] = np.concatenate([np.asarray(b.columns["x"], np.float32) for b in batches])
    np.testing.assert_array_equal(read["parquet"], read["tfrecord"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fleet_against_the_loop_is_measured_and_printed() -> None:
    # In a process of its own: the bench sets TensorFlow's thread pools, which a test process
    # that has already run TensorFlow (another test's) no longer lets anyone change.
    run = subprocess.run(
        [sys.executable, "-m", "bench.transforms", "--quick", "--skip", "scaling"],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for name in ("(1) CNN, Parquet", "(1) CNN, TFRecord", "(2) MLP, Parquet, one row each"):
        assert re.search(rf"{re.escape(name)}, round 1 +\d+\.\d\d", out), out
    assert re.search(r"fleet +\d+ records/s; CPU per record: client +\d", out), out
    assert "(>= 0.9)" in out and "(>= 0.7)" in out


def test_scaling_is_reported_against_n_times_one_child(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = argparse.Namespace(device_s=0.25, batch=256, sim_shard=2048, shards_per_child=4)
    rounds = [
        transforms.Scaled(1, (1,), 8192, 10.0, 1),
        transforms.Scaled(2, (1, 1), 16384, 11.0, 2),
        transforms.Scaled(8, (4, 4), 65536, 40.0, 1),
    ]
    rows = {name: value for name, value, _ in transforms.scaling_rows(rounds, args)}
    out = capsys.readouterr().out
    assert "N=8 (4+4): 65536 records in 40.0 s" in out
    assert "its shards ran on 1 of 8 children" in out
    assert rows["(3) N=2 vs N x one child"] == pytest.approx(10 / 11)
    assert rows["(3) N=8 vs N x one child"] == pytest.approx(0.25)
