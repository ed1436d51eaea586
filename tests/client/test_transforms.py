"""The client's side of transforms (DESIGN §14), against a transport that answers as the contract
says: the bodies it sends, a wait that follows the counts (with its bar), cancel and retry,
the list's cursor, and output parts (written by tffleet.datasets' own writers) read back as a
table, arrays and errors. Against the real API: test_transforms_api.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.client.fleet import NO_WAIT
from tffleet import AsyncClient, Client
from tffleet.client import NotFound, Transform, TransformWaitTimeout, transform_files
from tffleet.datasets import writers
from tffleet.datasets.locations import Location
from tffleet.objectstore import open_store

T = "0190c2d4-aaaa-7000-8000-000000000001"


def wire(status: str = "queued", done: int = 0, bad: int = 0, **fields: Any) -> dict[str, Any]:
    """A transform as the contract answers it: 10 records in 2 shards."""
    ended = status in ("succeeded", "failed", "canceled")
    return {
        "id": T,
        "status": status,
        "model": "double",
        "version": 1,
        "counts": {"records": 10, "succeeded": done, "failed": bad},
        "shards": {"total": 2, "done": 2 if ended else (done + bad) // 5, "failed": 0},
        "progress": (done + bad) / 10,
        "eta_s": None if ended else 3.0,
        "output": {"uri": f"tffleet://transforms/{T}/", "format": "parquet", "files": []},
        "errors_uri": f"tffleet://transforms/{T}/errors/",
        "created_at": "2026-11-27T08:00:00+00:00",
        "finished_at": "2026-11-27T08:01:00+00:00" if ended else None,
        **fields,
    }


class Contract(httpx.BaseTransport):
    """Answers the transform routes: `states` one GET after another (the last repeated), and
    files from `files`; records every request."""

    def __init__(self, states: list[dict[str, Any]], files: dict[str, bytes] | None = None):
        self.states = states
        self.files = files or {}
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        path, method = request.url.path, request.method
        base = f"/v1/transforms/{T}"
        if method == "POST" and path == "/v1/transforms":
            return httpx.Response(202, json=self.states[0])
        if method == "GET" and path == base:
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return httpx.Response(200, json=state)
        if method == "POST" and path in (f"{base}/cancel", f"{base}/retry"):
            return httpx.Response(200, json=self.states[-1])
        if path == f"{base}/files":
            listed = [
                {"name": n, "kind": "errors" if n.startswith("errors/") else "part"}
                for n in sorted(self.files, key=lambda n: (n.startswith("errors/"), n))
            ]
            return httpx.Response(200, json={"output_uri": "x", "files": listed})
        name = path.removeprefix(f"{base}/files/")
        if name in self.files:
            return httpx.Response(200, content=self.files[name])
        error = {"error": {"code": "not_found", "message": f"transform {path} not found"}}
        return httpx.Response(404, json=error)


def client_of(transport: httpx.BaseTransport) -> Client:
    return Client("http://t", transport=transport, retries=NO_WAIT)


def test_the_body_holds_what_was_given_and_no_more() -> None:
    contract = Contract([wire()])
    with client_of(contract) as client:
        handle = client.transform(
            "double",
            "tffleet://datasets/rows.csv",
            format="jsonl",
            columns={"x": "features"},
            key="id",
            shard_records=5,
        )
        client.transform("double", ["tffleet://datasets/a.csv", "tffleet://datasets/b.csv"])
    assert handle.id == T and handle.transform.records == 10
    first, second = (orjson.loads(r.content) for r in contract.requests)
    assert first == {
        "model": "double",
        "input": {"uri": "tffleet://datasets/rows.csv", "columns": {"x": "features"}, "key": "id"},
        "output": {"format": "jsonl"},
        "shard_records": 5,
    }
    assert second["input"] == {"uri": ["tffleet://datasets/a.csv", "tffleet://datasets/b.csv"]}
    assert second["output"] == {}
    keys = [r.headers["Idempotency-Key"] for r in contract.requests]
    assert len(set(keys)) == 2  # a fresh key each create, the same on each retry of one


def test_wait_follows_the_counts_to_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    states = [wire(), wire("running", done=5), wire("succeeded", done=9, bad=1)]
    contract = Contract(states)
    with client_of(contract) as client:
        handle = client.get_transform(T)
        done = handle.wait(progress=True)
    assert (done.status, done.records_succeeded, done.records_failed) == ("succeeded", 9, 1)
    assert done.ok and done.finished and handle.transform is done
    waits = [r.url.params.get("wait") for r in contract.requests[1:]]
    assert all(w is not None and float(w) > 0 for w in waits)
    bar = capsys.readouterr().err
    assert "10/10 rec" in bar and "failed=1" in bar and "shards=2/2" in bar and "rec/s" not in bar


def test_a_wait_that_runs_out_says_how_far_it_got() -> None:
    with (
        client_of(Contract([wire("running", done=5)])) as client,
        pytest.raises(TransformWaitTimeout) as caught,
    ):
        client.get_transform(T).wait(timeout=0, progress=False)
    assert caught.value.transform.records_succeeded == 5
    assert "5 of 10 records" in str(caught.value)


def test_cancel_retry_and_an_unknown_transform() -> None:
    contract = Contract([wire("running"), wire("canceled")])
    with client_of(contract) as client:
        handle = client.get_transform(T)
        assert handle.cancel().status == "canceled"
        assert handle.retry().status == "canceled"  # what the contract answered
        with pytest.raises(NotFound):
            client.get_transform("nope")
    posted = [r.url.path for r in contract.requests if r.method == "POST"]
    assert posted == [f"/v1/transforms/{T}/cancel", f"/v1/transforms/{T}/retry"]


def test_the_list_follows_its_cursor_up_to_the_limit() -> None:
    pages = {
        None: {"transforms": [wire(), wire()], "next_cursor": "c1"},
        "c1": {"transforms": [wire("succeeded", done=10)], "next_cursor": None},
    }
    seen: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.url.params))
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    with client_of(httpx.MockTransport(handler)) as client:
        listed = client.transforms(status="queued", limit=5)
        assert [t.status for t in listed] == ["queued", "queued", "succeeded"]
        assert len(client.transforms(limit=1)) == 1
    assert seen[0] == {"limit": "5", "status": "queued"}
    assert seen[1] == {"limit": "3", "status": "queued", "cursor": "c1"}


def test_an_answer_that_is_no_transform_is_a_protocol_error() -> None:
    from tffleet.client import ProtocolError

    with pytest.raises(ProtocolError, match="not a transform"):
        Transform.from_wire({"id": T, "status": "queued"})


# Reading the output back


def parts(tmp_path: Path, format: str) -> dict[str, bytes]:
    """Two parts as a worker writes them (tffleet.datasets.writers), and one errors file."""
    store = open_store(tmp_path.as_uri())
    batches = [
        {"index": np.arange(0, 3), "y": np.arange(12, dtype=np.float32).reshape(3, 4)},
        {"index": np.arange(4, 6), "y": np.arange(8, dtype=np.float32).reshape(2, 4) + 100},
    ]
    files: dict[str, bytes] = {}
    for shard, batch in enumerate(batches):
        name = f"part-{shard:05d}.{format}"
        chosen = {"y": batch["y"]} if format == "npy" else batch
        writers.write_part(Location(store, name, name), format, [chosen])
        files[name] = bytes(store.get(name))
    errors = Location(store, "errors/part-00000.jsonl", "e")
    writers.write_errors(errors, [(3, None, "x: a non-finite value")])
    files["errors/part-00000.jsonl"] = bytes(store.get("errors/part-00000.jsonl"))
    return files


@pytest.mark.parametrize("format", ["parquet", "jsonl", "npy"])
def test_the_output_reads_back_as_a_table_and_arrays(tmp_path: Path, format: str) -> None:
    ended = wire("succeeded", done=5, bad=1, output={"uri": "u", "format": format, "files": []})
    contract = Contract([ended], parts(tmp_path, format))
    with client_of(contract) as client:
        handle = client.get_transform(T)
        table = handle.read()
        arrays = handle.arrays()
        errors = handle.errors()
        saved = handle.download(tmp_path / "out")
    expected = np.concatenate(
        [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(8).reshape(2, 4) + 100]
    )
    column = "output" if format == "npy" else "y"
    np.testing.assert_array_equal(arrays[column], expected)
    assert table.num_rows == 5 and column in table.column_names
    if format != "npy":
        assert arrays["index"].tolist() == [0, 1, 2, 4, 5]
    assert errors == [{"index": 3, "key": None, "reason": "x: a non-finite value"}]
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in saved) == sorted(
        contract.files
    )


def test_column_array_unnests_fixed_size_lists() -> None:
    values = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    flat = pa.array(values.reshape(-1))
    nested = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(flat, 4), 3)
    np.testing.assert_array_equal(transform_files.column_array(nested), values)
    buffer = io.BytesIO()
    pq.write_table(pa.table({"v": nested}), buffer)
    table = transform_files.read_table("parquet", [buffer.getvalue()])
    np.testing.assert_array_equal(transform_files.column_array(table.column("v")), values)


# Datasets


def test_a_dataset_is_streamed_from_its_file(tmp_path: Path) -> None:
    source = tmp_path / "rows.csv"
    source.write_bytes(b"id,x\n" + b"1,2\n" * 500_000)
    got: list[tuple[str, bytes, bool, dict[str, str]]] = []

    class Store(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            streamed = not isinstance(request.stream, httpx.ByteStream)
            body = request.read()
            got.append((request.url.path, body, streamed, dict(request.url.params)))
            uri = "tffleet://datasets/" + request.url.path.removeprefix("/v1/datasets/")
            return httpx.Response(201, json={"uri": uri, "size": len(body), "replaced": False})

    with client_of(Store()) as client:
        uri = client.put_dataset(source, "tffleet://datasets/a b/rows.csv")
        client.put_dataset(b"id\n", "plain.csv", overwrite=True)
        with pytest.raises(ValueError, match="tffleet://datasets/"):
            client.put_dataset(b"", "s3://bucket/x.csv")
    assert uri == "tffleet://datasets/a b/rows.csv"
    (path, body, streamed, params), (path2, _, _, params2) = got
    assert (path, body, streamed, params) == (
        "/v1/datasets/a b/rows.csv",
        source.read_bytes(),
        True,
        {},
    )
    assert (path2, params2) == ("/v1/datasets/plain.csv", {"overwrite": "true"})


@pytest.mark.anyio
async def test_the_async_client_has_the_same_handle(tmp_path: Path) -> None:
    states = [wire(), wire("succeeded", done=5, bad=1)]
    files = parts(tmp_path, "parquet")

    async def handler(request: httpx.Request) -> httpx.Response:
        return Contract.handle_request(contract, request)

    contract = Contract(states, files)
    async with AsyncClient(
        "http://t", transport=httpx.MockTransport(handler), retries=NO_WAIT
    ) as client:
        handle = await client.transform("double", "tffleet://datasets/rows.parquet")
        done = await handle.wait(progress=False)
        arrays = await handle.arrays()
        errors = await handle.errors()
    assert done.status == "succeeded"
    assert arrays["index"].tolist() == [0, 1, 2, 4, 5] and len(errors) == 1
