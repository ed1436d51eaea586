"""GET /v1/transforms/{id}/files[/{name}]: what a transform wrote, listed and streamed back from
where it lies (the fleet's store, or an allowed directory), nothing else found beside it; another
tenant's transform is 404, an admin's key reads any. No worker runs: the parts are written where
a shard would write them."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.api.conftest import Api, OpenApi
from tffleet.objectstore import ObjectStore, open_store

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("object_store_url", ["file"], indirect=True),
]


def parquet(records: int) -> bytes:
    x = np.arange(records * 4, dtype=np.float32).reshape(records, 4)
    table = pa.table({"features": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4)})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


@pytest.fixture
async def store_api(
    object_store: ObjectStore, open_api: OpenApi, tmp_path: Path
) -> AsyncIterator[Api]:
    (tmp_path / "allowed").mkdir()
    async with open_api(transform_locations=f"{(tmp_path / 'allowed').as_uri()}/") as running:
        yield running


async def create(api: Api, output: str | None = None, **headers: str) -> dict[str, object]:
    put = await api.client.put("/v1/datasets/rows.parquet", content=parquet(10), headers=headers)
    assert put.status_code in (200, 201), put.text
    body: dict[str, object] = {
        "model": "mlp",
        "input": {"uri": "tffleet://datasets/rows.parquet", "columns": {"x": "features"}},
        "output": {"format": "jsonl", **({"uri": output} if output else {})},
        "shard_records": 4,
    }
    made = await api.client.post("/v1/transforms", json=body, headers=headers)
    assert made.status_code == 202, made.text
    return dict(made.json())


async def test_its_files_are_listed_and_streamed_nothing_else(
    store_api: Api, object_store: ObjectStore
) -> None:
    transform = await create(store_api)
    prefix = f"default/transforms/{transform['id']}/"
    written = {
        "part-00001.jsonl": b'{"index":4}\n',
        "part-00000.jsonl": b'{"index":0}\n',
        "errors/part-00000.jsonl": b'{"index":2,"key":null,"reason":"r"}\n',
        "part-00000.parquet": b"not this transform's format",
        "part-00007.jsonl": b"a shard it does not have",
        "notes.txt": b"not a transform's file",
    }
    for name, data in written.items():
        object_store.put(prefix + name, data)
    base = f"/v1/transforms/{transform['id']}/files"
    listed = await store_api.client.get(base)
    assert listed.status_code == 200, listed.text
    assert listed.json()["files"] == [
        {"name": "part-00000.jsonl", "kind": "part"},
        {"name": "part-00001.jsonl", "kind": "part"},
        {"name": "errors/part-00000.jsonl", "kind": "errors"},
    ]
    got = await store_api.client.get(f"{base}/errors/part-00000.jsonl")
    assert got.status_code == 200 and got.content == written["errors/part-00000.jsonl"]
    assert got.headers["content-length"] == str(len(got.content))
    assert got.headers["content-type"].startswith("application/jsonl")
    for name, status in (
        ("notes.txt", 404),
        ("part-00002.jsonl", 404),
        ("%2E%2E/part-00000.jsonl", 404),
    ):
        missing = await store_api.client.get(f"{base}/{name}")
        assert missing.status_code == status, (name, missing.text)
        assert missing.json()["error"]["message"].startswith("name: ")


async def test_an_output_in_an_allowed_directory_is_read_there(
    store_api: Api, tmp_path: Path
) -> None:
    out = tmp_path / "allowed" / "out"
    transform = await create(store_api, output=f"{out.as_uri()}/")
    open_store((tmp_path / "allowed").as_uri()).put("out/part-00002.jsonl", b'{"index":8}\n')
    base = f"/v1/transforms/{transform['id']}/files"
    assert (await store_api.client.get(base)).json()["files"] == [
        {"name": "part-00002.jsonl", "kind": "part"}
    ]
    got = await store_api.client.get(f"{base}/part-00002.jsonl")
    assert got.content == b'{"index":8}\n'


async def test_another_tenants_transform_is_404_an_admin_reads_it(
    store_api: Api, object_store: ObjectStore
) -> None:
    acme = store_api.key("acme")
    transform = await create(store_api, **acme)
    object_store.put(f"acme/transforms/{transform['id']}/part-00000.jsonl", b"{}\n")
    base = f"/v1/transforms/{transform['id']}/files"
    other = await store_api.client.get(base, headers=store_api.key("globex"))
    assert other.status_code == 404
    assert (await store_api.client.get(f"{base}/part-00000.jsonl", headers=acme)).content == b"{}\n"
    admin = await store_api.client.get(f"{base}/part-00000.jsonl")  # the default admin key
    assert admin.status_code == 200 and admin.content == b"{}\n"
    unknown = await store_api.client.get(
        "/v1/transforms/0190c2d4-aaaa-7000-8000-000000000001/files"
    )
    assert unknown.status_code == 404


async def test_staging_leftovers_of_a_killed_writer_are_never_listed_or_served(
    store_api: Api, tmp_path: Path
) -> None:
    # A worker killed mid-write leaves obstore's staging file (`<name>#<n>`) beside the part in
    # a file:// output; the part, once written whole, replaces nothing of it.
    out = tmp_path / "allowed" / "out"
    transform = await create(store_api, output=f"{out.as_uri()}/")
    (out / "errors").mkdir(parents=True)
    (out / "part-00000.jsonl#1").write_bytes(b'{"index":0')
    (out / "part-00001.jsonl#0a1b2c").write_bytes(b"")
    (out / "errors" / "part-00001.jsonl#2").write_bytes(b'{"index":5')
    (out / "part-00001.jsonl").write_bytes(b'{"index":4}\n')
    base = f"/v1/transforms/{transform['id']}/files"
    assert (await store_api.client.get(base)).json()["files"] == [
        {"name": "part-00001.jsonl", "kind": "part"}
    ]
    for name in ("part-00000.jsonl%231", "errors/part-00001.jsonl%232"):
        missing = await store_api.client.get(f"{base}/{name}")
        assert missing.status_code == 404, (name, missing.text)
