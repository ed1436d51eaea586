"""Each input format inspected and read by shards, over a directory and a real S3 (SeaweedFS):
a shard's range gives exactly its records, in order; a bad record is reported with its number
and reason and the others go on."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import orjson
import pyarrow as pa
import pytest

from tests.datasets import files
from tffleet.datasets import access, formats
from tffleet.datasets.base import INDEX_EVERY, Batch, Column, DatasetError
from tffleet.datasets.locations import Location
from tffleet.datasets.text import SAMPLE_RECORDS

Put = Callable[[str, bytes], Location]


def gather(
    batches: list[Batch], column: str
) -> tuple[np.ndarray, list[int], list[tuple[int, str]]]:
    rows = [batch.columns[column] for batch in batches if len(batch)]
    index = [int(i) for batch in batches for i in batch.index]
    errors = [error for batch in batches for error in batch.errors]
    return (np.concatenate(rows) if rows else np.empty(0)), index, errors


def test_parquet_inspect_reads_the_schema_and_ranges_cross_row_groups(put: Put) -> None:
    records = 1000
    pixels = files.images(records).reshape(records, -1)
    table = pa.table(
        {
            "id": pa.array(np.arange(records, dtype=np.int64)),
            "pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), pixels.shape[1]),
            "label": pa.array([f"r{i}" for i in range(records)]),
        }
    )
    where = put("tables/a.parquet", files.parquet(table, row_group_size=128))
    info = formats.inspect(where, "parquet")
    assert info.records == records
    assert info.schema == {
        "id": Column("int64"),
        "pixels": Column("float32", (48,)),
        "label": Column("string"),
    }
    # A shard that starts inside a row group and ends inside another, in odd batches.
    batches = list(formats.read(where, "parquet", 100, 400, ["pixels"], 70, key="id"))
    got, index, errors = gather(batches, "pixels")
    assert index == list(range(100, 400)) and not errors
    assert [len(b) for b in batches] == [70, 70, 70, 70, 20]
    np.testing.assert_array_equal(got, pixels[100:400])
    np.testing.assert_array_equal(np.concatenate([b.keys for b in batches]), np.arange(100, 400))
    assert list(formats.read(where, "parquet", 5, 5)) == []


def test_parquet_nulls_and_ragged_lists_are_bad_records(put: Put) -> None:
    table = pa.table(
        {
            "v": pa.array([[1.0, 2.0], None, [3.0, 4.0], [5.0, None], [6.0, 7.0]]),
            "meta": pa.array([{"a": i} for i in range(5)]),  # a struct: no tensor, not listed
        }
    )
    where = put("tables/nulls.parquet", files.parquet(table, row_group_size=2))
    assert formats.inspect(where, "parquet").schema == {"v": Column("float64", (-1,))}
    got, index, errors = gather(list(formats.read(where, "parquet", 0, 5, None, 10)), "v")
    assert index == [0, 2, 4]
    assert [i for i, _ in errors] == [1, 3] and "'v' is null" in errors[0][1]
    np.testing.assert_array_equal(got, [[1, 2], [3, 4], [6, 7]])


def test_npy_header_only_and_row_ranges(put: Put) -> None:
    array = files.images(300)
    where = put("arrays/x.npy", files.npy(array))
    info = formats.inspect(where, "npy")
    assert info.records == 300 and info.schema == {"array": Column("float32", (4, 4, 3))}
    got, index, errors = gather(list(formats.read(where, "npy", 7, 250, None, 64)), "array")
    assert index == list(range(7, 250)) and not errors
    np.testing.assert_array_equal(got, array[7:250])


def test_npy_refuses_what_it_cannot_read(put: Put) -> None:
    where = put("arrays/f.npy", files.npy(np.asfortranarray(files.images(3).reshape(3, -1))))
    with pytest.raises(DatasetError, match=r"f\.npy: a Fortran-order"):
        formats.inspect(where, "npy")
    with pytest.raises(DatasetError, match=r"not an \.npy"):
        formats.inspect(put("arrays/g.npy", b"hello"), "npy")


def test_jsonl_index_ranges_and_bad_records(put: Put) -> None:
    records = 3 * INDEX_EVERY + 17
    lines = [orjson.dumps({"id": i, "x": [i, i + 0.5], "name": f"n{i}"}) for i in range(records)]
    lines[5] = b"{not json"
    lines[INDEX_EVERY + 3] = orjson.dumps({"id": 9, "x": [1.0, 2.0, 3.0], "name": "long"})
    lines[2 * INDEX_EVERY] = orjson.dumps([1, 2])
    where = put("lines/a.jsonl", b"\n".join(lines) + b"\n")
    info = formats.inspect(where, "jsonl")
    assert info.records == records
    assert info.schema == {
        "id": Column("int64"),
        "x": Column("float64", (2,)),
        "name": Column("string"),
    }
    assert info.index is not None and len(info.index.offsets) == 4
    # The index is kept as JSON by the API and handed back to the shard's read.
    info = formats.info_from_json(orjson.loads(orjson.dumps(info.to_json())))
    start, stop = INDEX_EVERY - 10, 2 * INDEX_EVERY + 10
    batches = list(formats.read(where, "jsonl", start, stop, ["x"], 100, key="id", info=info))
    got, index, errors = gather(batches, "x")
    bad = {INDEX_EVERY + 3, 2 * INDEX_EVERY}
    assert index == [i for i in range(start, stop) if i not in bad]
    assert [i for i, _ in errors] == sorted(bad)
    assert "shape [3], expected [2]" in errors[0][1] and "not an object" in errors[1][1]
    np.testing.assert_array_equal(got[:, 0], index)
    np.testing.assert_array_equal(np.concatenate([b.keys for b in batches]), index)
    # From the start, over the line that is no JSON.
    _, index, errors = gather(list(formats.read(where, "jsonl", 0, 8, info=info)), "x")
    assert index == [0, 1, 2, 3, 4, 6, 7] and errors[0][0] == 5


def test_text_schemas_come_from_the_first_sample_records_and_later_misfits_are_bad_records(
    put: Put,
) -> None:
    # Record 142 (past the sample, before the index's next point) holds another type; the
    # schema is the first SAMPLE_RECORDS records', and record 142 is a bad record when read.
    assert SAMPLE_RECORDS < 142 < INDEX_EVERY
    lines = [orjson.dumps({"id": i, "x": [i, i + 1]}) for i in range(300)]
    lines[142] = orjson.dumps({"id": 142, "x": ["a", "b"]})
    lines[143] = orjson.dumps({"id": "143", "x": [1, 2]})
    lines[144] = orjson.dumps({"id": 144.5, "x": [1, 2]})
    where = put("lines/late.jsonl", b"\n".join(lines) + b"\n")
    info = formats.inspect(where, "jsonl")
    assert info.schema == {"id": Column("int64"), "x": Column("int64", (2,))}
    batches = list(formats.read(where, "jsonl", 140, 150, ["x"], 4, key="id", info=info))
    _, index, errors = gather(batches, "x")
    assert index == [140, 141, 145, 146, 147, 148, 149]
    assert [(i, reason) for i, reason in errors] == [
        (142, "column 'x': not int64 (a JSON text value)"),
        (143, "column 'id': not int64 (a JSON text value)"),
        (144, "column 'id': not int64 (a JSON fractional value)"),
    ]
    rows = ["id,x"] + [f"{i},{i / 2}" for i in range(300)]
    rows[1 + 142] = "142,not-a-number"
    where = put("text/late.csv", ("\n".join(rows) + "\n").encode())
    info = formats.inspect(where, "csv")
    assert info.schema == {"id": Column("int64"), "x": Column("float64")}
    _, index, errors = gather(list(formats.read(where, "csv", 140, 145, info=info)), "x")
    assert index == [140, 141, 143, 144]
    assert errors == [(142, "column 'x': 'not-a-number' is no float64")]


def test_the_schema_sample_is_the_same_number_of_records_in_both_text_formats(
    put: Put,
) -> None:
    # Record SAMPLE_RECORDS (the first past the sample) alone holds text: both formats keep
    # their numeric schema.
    lines = [orjson.dumps({"x": i}) for i in range(SAMPLE_RECORDS + 5)]
    lines[SAMPLE_RECORDS] = orjson.dumps({"x": "text"})
    where = put("lines/edge.jsonl", b"\n".join(lines) + b"\n")
    assert formats.inspect(where, "jsonl").schema == {"x": Column("int64")}
    rows = ["x"] + [str(i) for i in range(SAMPLE_RECORDS + 5)]
    rows[1 + SAMPLE_RECORDS] = "text"
    where = put("text/edge.csv", ("\n".join(rows) + "\n").encode())
    assert formats.inspect(where, "csv").schema == {"x": Column("int64")}
    # One record earlier, it is in the sample: both formats take the column as text.
    lines[SAMPLE_RECORDS - 1] = orjson.dumps({"x": "text"})
    where = put("lines/edge2.jsonl", b"\n".join(lines) + b"\n")
    assert formats.inspect(where, "jsonl").schema == {"x": Column("string")}
    rows[SAMPLE_RECORDS] = "text"
    where = put("text/edge2.csv", ("\n".join(rows) + "\n").encode())
    assert formats.inspect(where, "csv").schema == {"x": Column("string")}


def test_csv_quoted_newlines_are_one_record(put: Put) -> None:
    rows = ["id,text,score"]
    for i in range(2 * INDEX_EVERY + 5):
        text = f'"line one\nline ""two"" of {i}"' if i % 3 == 0 else f"plain {i}"
        rows.append(f"{i},{text},{i / 2}")
    rows[1 + 7] = "7,too,many,fields"
    rows[1 + INDEX_EVERY + 1] = f"{INDEX_EVERY + 1},x,not-a-number"
    where = put("text/a.csv", ("\r\n".join(rows) + "\r\n").encode())
    info = formats.inspect(where, "csv")
    assert info.records == 2 * INDEX_EVERY + 5
    assert info.schema == {
        "id": Column("int64"),
        "text": Column("string"),
        "score": Column("float64"),
    }
    start, stop = INDEX_EVERY - 4, INDEX_EVERY + 4  # record 1020 has a quoted newline
    batches = list(formats.read(where, "csv", start, stop, ["text", "score"], 3, info=info))
    texts, index, errors = gather(batches, "text")
    assert index == [i for i in range(start, stop) if i != INDEX_EVERY + 1]
    assert errors == [(INDEX_EVERY + 1, "column 'score': 'not-a-number' is no float64")]
    assert texts[0] == f'line one\nline "two" of {start}'.encode()
    _, index, errors = gather(list(formats.read(where, "csv", 0, 10, info=info)), "id")
    assert index == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert errors == [(7, "4 fields where the header has 3")]


def test_csv_unclosed_quote_is_refused(put: Put) -> None:
    where = put("text/bad.csv", b'a,b\n1,"open\n2,3\n')
    with pytest.raises(DatasetError, match=r"bad\.csv: a quoted field is never closed"):
        formats.inspect(where, "csv")


def test_tfrecord_frames_indexed_and_examples_decoded(put: Put) -> None:
    records = files.examples(INDEX_EVERY + 40)
    records[3] = b"\xff\xff not an example"
    where = put("records/a.tfrecord", files.tfrecord(records))
    info = formats.inspect(where, "tfrecord")
    assert info.records == INDEX_EVERY + 40
    assert info.schema == {
        "x": Column("float32", (48,)),
        "id": Column("int64", (1,)),
        "name": Column("string", (1,)),
    }
    start, stop = INDEX_EVERY - 5, INDEX_EVERY + 30
    batches = list(formats.read(where, "tfrecord", start, stop, ["x"], 16, key="name", info=info))
    got, index, errors = gather(batches, "x")
    assert index == list(range(start, stop)) and not errors
    np.testing.assert_allclose(got[:, 0], index)
    assert np.concatenate([b.keys for b in batches])[0][0] == f"r{start}".encode()
    _, index, errors = gather(list(formats.read(where, "tfrecord", 0, 6, ["id"], info=info)), "id")
    assert (
        index == [0, 1, 2, 4, 5] and errors[0][0] == 3 and "not a tf.train.Example" in errors[0][1]
    )


def test_tfrecord_broken_frame_is_refused(put: Put) -> None:
    data = bytearray(files.tfrecord(files.examples(3)))
    data[9] ^= 0xFF  # the first length's CRC
    with pytest.raises(DatasetError, match=r"a\.tfrecord: a corrupt frame at byte 0"):
        formats.inspect(put("records/broken/a.tfrecord", bytes(data)), "tfrecord")
    truncated = files.tfrecord(files.examples(3))[:-5]
    with pytest.raises(DatasetError, match="truncated"):
        formats.inspect(put("records/cut.tfrecord", truncated), "tfrecord")


def test_a_range_outside_the_file_is_refused(put: Put) -> None:
    where = put("arrays/y.npy", files.npy(np.zeros((4, 2), np.float32)))
    with pytest.raises(ValueError, match=r"records \[2, 9\) of 4 records"):
        list(formats.read(where, "npy", 2, 9))
    with pytest.raises(ValueError, match="format 'xls'"):
        formats.inspect(where, "xls")


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the ranges read from the store, as they are read."""
    sizes: list[int] = []
    read_range = access.read_range

    def counted(location: Location, start: int, end: int) -> bytes:
        data = read_range(location, start, end)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(access, "read_range", counted)
    return sizes


def test_reads_are_lean(put: Put, bytes_read: list[int]) -> None:
    records = 20_000
    values = files.images(records).reshape(records, -1)
    table = pa.table({"v": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 48)})
    big = put("lean/a.parquet", files.parquet(table, row_group_size=1000))
    size = big.store.size(big.key)
    assert size is not None and size > 3_000_000
    formats.inspect(big, "parquet")  # the footer only
    assert sum(bytes_read) < size / 10
    bytes_read.clear()
    list(formats.read(big, "parquet", 15_000, 15_100, ["v"]))  # one row group of twenty
    assert sum(bytes_read) < size / 5
    bytes_read.clear()
    formats.inspect(put("lean/a.npy", files.npy(values)), "npy")
    assert sum(bytes_read) <= 4096
    lines = b"".join(orjson.dumps({"v": row.tolist()}) + b"\n" for row in values)
    where = put("lean/a.jsonl", lines)
    info = formats.inspect(where, "jsonl")
    bytes_read.clear()
    list(formats.read(where, "jsonl", 15_000, 15_100, info=info))  # from its sampled offset
    assert sum(bytes_read) < (INDEX_EVERY + 200) * len(lines) / records
