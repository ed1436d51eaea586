"""PUT /v1/datasets/{path}: a file streamed into the fleet's store under the caller's tenant, for
transforms to read as tffleet://datasets/<path>; a directory store and a real S3 server. What it
refuses leaves nothing, and no written-ahead garbage outlives a request."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import ObjectGarbage
from tests.api.conftest import Api, OpenApi
from tffleet.datasets import formats
from tffleet.datasets.locations import resolve
from tffleet.objectstore import ObjectStore

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

CSV = b"id,x0,x1\n" + b"".join(f"{i},{i / 2},{i * 3}\n".encode() for i in range(50))


def garbage_keys(sessions: Sessions) -> list[str]:
    with sessions() as session:
        return [row.key for row in session.scalars(select(ObjectGarbage))]


async def put(api: Api, path: str, body: bytes, **params: object) -> httpx.Response:
    return await api.client.put(
        f"/v1/datasets/{path}",
        content=body,
        headers={"Content-Type": "application/octet-stream"},
        params=params,
    )


async def test_a_file_is_stored_under_the_tenant_for_a_transform_to_read(
    store_api: Api, object_store: ObjectStore
) -> None:
    response = await put(store_api, "iris/train.csv", CSV)
    assert response.status_code == 201, response.text
    assert response.json() == {
        "uri": "tffleet://datasets/iris/train.csv",
        "size": len(CSV),
        "replaced": False,
    }
    assert bytes(object_store.get("default/datasets/iris/train.csv")) == CSV
    assert garbage_keys(store_api.sessions) == []
    # What a transform would do with the URI: resolved for the tenant, inspected.
    location = resolve(response.json()["uri"], "default", store_api.state.settings)
    info = formats.inspect(location, "csv")
    assert info.records == 50 and set(info.schema) == {"id", "x0", "x1"}


async def test_each_tenant_has_its_own_datasets(store_api: Api, object_store: ObjectStore) -> None:
    other = store_api.key("acme")
    response = await store_api.client.put("/v1/datasets/a.csv", content=CSV, headers=other)
    assert response.status_code == 201, response.text
    assert response.json()["uri"] == "tffleet://datasets/a.csv"
    assert object_store.size("acme/datasets/a.csv") == len(CSV)
    assert object_store.size("default/datasets/a.csv") is None


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_file_there_is_kept_unless_overwrite(
    store_api: Api, object_store: ObjectStore
) -> None:
    assert (await put(store_api, "d/x.csv", CSV)).status_code == 201
    refused = await put(store_api, "d/x.csv", b"id\n1\n")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["message"].startswith("path: tffleet://datasets/d/x.csv")
    assert bytes(object_store.get("default/datasets/d/x.csv")) == CSV
    replaced = await put(store_api, "d/x.csv", b"id\n1\n", overwrite="true")
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["replaced"] is True
    assert bytes(object_store.get("default/datasets/d/x.csv")) == b"id\n1\n"
    assert garbage_keys(store_api.sessions) == []


@pytest.mark.parametrize(
    "path",
    [
        "a/%2E%2E/b.csv",
        "a//b.csv",
        "%2E/b.csv",
        "folder/",
        "a/%2e/b",
        "%2E%2E/acme/x.csv",
        "a%03b.csv",
        "%7F",
        "%7CE%5Cu%5Dr%7C",  # `|E\u]r|`: found by test_fuzz (obstore's directory store 503'd)
        "a/b:",
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_bad_path_is_422_naming_path_and_stores_nothing(
    store_api: Api, object_store: ObjectStore, path: str
) -> None:
    # A client collapses `..` and `.` in a URL's path; escaped, they reach the API as parts.
    response = await put(store_api, path, CSV)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"].startswith("path: ")
    assert object_store.total_bytes() == (0, 0)
    assert garbage_keys(store_api.sessions) == []


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_body_over_the_limit_is_413_and_leaves_nothing(
    object_store: ObjectStore, open_api: OpenApi
) -> None:
    async with open_api(max_upload_bytes=100) as api:
        declared = await put(api, "big.csv", CSV)
        assert declared.status_code == 413, declared.text

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: found as it streams
            for at in range(0, len(CSV), 64):
                yield CSV[at : at + 64]

        streamed = await api.client.put("/v1/datasets/big.csv", content=chunks())
        assert streamed.status_code == 413, streamed.text
        assert object_store.total_bytes() == (0, 0)
        assert garbage_keys(api.sessions) == []


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_failed_overwrite_keeps_the_file_that_was_there(
    object_store: ObjectStore, open_api: OpenApi
) -> None:
    async with open_api(max_upload_bytes=len(CSV)) as api:
        assert (await put(api, "keep.csv", CSV)).status_code == 201

        async def chunks() -> AsyncIterator[bytes]:
            yield CSV
            yield b"one more row that passes the limit\n"

        response = await api.client.put(
            "/v1/datasets/keep.csv", content=chunks(), params={"overwrite": "true"}
        )
        assert response.status_code == 413, response.text
        assert bytes(object_store.get("default/datasets/keep.csv")) == CSV
        assert garbage_keys(api.sessions) == []


async def test_no_key_no_dataset(store_api: Api) -> None:
    response = await store_api.client.put(
        "/v1/datasets/a.csv", content=CSV, headers={"Authorization": ""}
    )
    assert response.status_code == 401
