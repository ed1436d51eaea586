"""`tffleet datasets put`, `tffleet transform` and `tffleet transforms ...` against `tffleet api` in
a subprocess (`served`), its shards run by `FakeShardWorker` (tests/client/shard_worker.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from tests.client.fleet import Served, fake_model
from tests.client.shard_worker import FakeShardWorker
from tffleet.cli import main
from tffleet.cli.jobs import UsageError
from tffleet.cli.transform import columns_of

CSV = "id,a0,a1,a2\n" + "".join(f"row{i},{i},{i + 1},{i + 2}\n" for i in range(7))


@pytest.fixture
def shards(served: Served) -> Iterator[FakeShardWorker]:
    fake = FakeShardWorker(served.database_url, served.redis_url, served.object_store)
    yield fake
    fake.close()


@pytest.mark.slow
def test_put_transform_wait_and_download(
    served: Served,
    shards: FakeShardWorker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TFFLEET_URL", served.url)
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.save(tmp_path / "x.npy", x)
    assert main(["datasets", "put", str(tmp_path / "x.npy"), "tffleet://datasets/cli/x.npy"]) == 0
    assert capsys.readouterr().out.strip() == "tffleet://datasets/cli/x.npy"
    # Again: refused, the file kept (exit 1), unless --overwrite.
    assert main(["datasets", "put", str(tmp_path / "x.npy"), "cli/x.npy"]) == 1
    assert "overwrite" in capsys.readouterr().err
    assert main(["datasets", "put", str(tmp_path / "x.npy"), "cli/x.npy", "--overwrite"]) == 0
    capsys.readouterr()

    shards.serve()
    command = ["transform", "--model", "double", "--input", "tffleet://datasets/cli/x.npy"]
    assert main([*command, "--shard-records", "4", "--wait", "--timeout", "30"]) == 0
    done = orjson.loads(capsys.readouterr().out)
    assert done["status"] == "succeeded" and done["counts"]["succeeded"] == 6
    assert done["shards"]["total"] == 2

    out = tmp_path / "out"
    assert main(["transforms", "download", done["id"], str(out)]) == 0
    assert capsys.readouterr().out.split() == [
        str(out / "part-00000.parquet"),
        str(out / "part-00001.parquet"),
    ]
    table = pq.read_table(out)
    y = np.stack(table.column("y").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(y, fake_model({"x": x})["y"])

    assert main(["transforms", "status", done["id"]]) == 0
    assert orjson.loads(capsys.readouterr().out)["id"] == done["id"]
    assert main(["transforms", "list", "--limit", "1"]) == 0
    assert orjson.loads(capsys.readouterr().out)["id"] == done["id"]


@pytest.mark.slow
def test_without_wait_the_id_then_cancel_and_status(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", served.url]
    np.save(tmp_path / "x.npy", np.ones((9, 4), np.float32))
    assert main(["datasets", "put", str(tmp_path / "x.npy"), "cli2/x.npy", *url]) == 0
    capsys.readouterr()
    run = ["transform", "--model", "double", "--input", "tffleet://datasets/cli2/x.npy", *url]
    assert main([*run, "--shard-records", "3"]) == 0
    transform_id = capsys.readouterr().out.strip()
    assert main(["transforms", "cancel", transform_id, *url]) == 0
    assert orjson.loads(capsys.readouterr().out)["status"] == "canceled"
    assert main(["transforms", "status", transform_id, "--wait", "5", *url]) == 1
    assert orjson.loads(capsys.readouterr().out)["status"] == "canceled"


@pytest.mark.slow
def test_columns_that_do_not_fit_are_refused_naming_them(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", served.url]
    (tmp_path / "rows.csv").write_text(CSV)
    assert main(["datasets", "put", str(tmp_path / "rows.csv"), "cli3/rows.csv", *url]) == 0
    capsys.readouterr()
    # `pair` takes `a` of 3 floats and `b` of 2 ints a record: a scalar column feeds neither.
    run = ["transform", "--model", "pair", "--input", "tffleet://datasets/cli3/rows.csv", *url]
    assert main([*run, "--columns", "a=a0,b=a1", "--key", "id"]) == 1
    err = capsys.readouterr().err
    assert "columns.a" in err and "columns.b" in err
    assert main([*run, "--columns", "a=a0", "--columns", "bad"]) == 2
    assert "INPUT=COLUMN" in capsys.readouterr().err


def test_columns_are_input_equals_column() -> None:
    assert columns_of(["x=pixels,y=label", "z=other"]) == {
        "x": "pixels",
        "y": "label",
        "z": "other",
    }
    assert columns_of(None) is None
    with pytest.raises(UsageError, match="INPUT=COLUMN"):
        columns_of(["x"])


def test_a_missing_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["datasets", "put", str(tmp_path / "nope.csv"), "a.csv"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert (
        main(["datasets", "put", __file__, "s3://bucket/a.csv", "--url", "http://127.0.0.1:9"]) == 2
    )
