"""POST /v1/uploads: an .npy streamed into the object store (a directory, and a real S3 server),
the row that records it, and the bodies it refuses leaving neither object nor row."""

from __future__ import annotations

import io
import shutil
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Upload
from tests.api.conftest import Api, OpenApi
from tffleet import tensors
from tffleet.objectstore import ObjectStore, keys

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

X = np.arange(24, dtype=np.float32).reshape(6, 4)


def npy(array: np.ndarray) -> bytes:
    """What np.save writes: numpy's writer, not ours."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.fixture
async def store_api(object_store: ObjectStore, open_api: OpenApi) -> AsyncIterator[Api]:
    """The app on the test's store (a directory, then S3)."""
    async with open_api() as running:
        yield running


def uploads(sessions: Sessions) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Upload)) or 0)


async def post(api: Api, body: bytes, media: str = tensors.NPY, **params: Any) -> httpx.Response:
    return await api.client.post(
        "/v1/uploads", content=body, headers={"Content-Type": media}, params=params
    )


async def test_an_npy_is_stored_whole_and_recorded(
    store_api: Api, object_store: ObjectStore
) -> None:
    body = npy(X)
    response = await post(store_api, body)
    assert response.status_code == 201, response.text
    out = response.json()
    upload_id = keys.parse_upload_uri(out["uri"])
    assert upload_id is not None
    assert (out["dtype"], out["shape"], out["size"], out["upload_url"]) == (
        "float32", [6, 4], len(body), None
    )  # fmt: skip
    assert datetime.fromisoformat(out["expires_at"]) > datetime.fromisoformat(
        "2026-01-01T00:00:00+00:00"
    )
    key = keys.upload_key("default", upload_id)
    assert bytes(object_store.get(key)) == body
    with store_api.sessions() as session:
        row = session.get(Upload, upload_id)
        assert row is not None
        assert (row.tenant, row.key, row.size) == ("default", key, len(body))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "empty"),
        (b"not an npy at all, just bytes", "magic"),
        (npy(X)[:-4], "need"),  # cut short
        (npy(X) + b"\0" * 4, "need"),  # too long
        (npy(np.array([object()], dtype=object)), "pickle"),
        (npy(np.array(["a", "b"])), "strings inline"),
        (npy(X.astype(">f4")), "big-endian"),
        (npy(np.asfortranarray(X)), "Fortran"),
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_body_that_is_no_fit_npy_leaves_nothing(
    store_api: Api, object_store: ObjectStore, body: bytes, says: str
) -> None:
    response = await post(store_api, body)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("body: ") and says in message
    assert object_store.total_bytes() == (0, 0)
    assert uploads(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_body_cut_short_without_a_length_leaves_nothing(
    store_api: Api, object_store: ObjectStore
) -> None:
    """Streamed (chunked, no Content-Length): the shortfall is found at its end."""
    body = npy(np.ones((1000, 10), dtype=np.float64))

    async def chunks() -> AsyncIterator[bytes]:
        yield body[:100]
        yield body[100:-8]

    response = await store_api.client.post(
        "/v1/uploads", content=chunks(), headers={"Content-Type": tensors.NPY}
    )
    assert response.status_code == 422
    assert "body: holds 79992 bytes" in response.json()["error"]["message"]
    assert object_store.total_bytes() == (0, 0)
    assert uploads(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_npz_and_other_types_are_415(store_api: Api) -> None:
    response = await post(store_api, b"PK\x03\x04", media=tensors.NPZ)
    assert response.status_code == 415
    assert tensors.NPY in response.json()["error"]["message"]
    response = await post(store_api, b"{}", media="application/json")
    assert response.status_code == 415


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_body_over_the_upload_limit_is_413(
    object_store: ObjectStore, open_api: OpenApi
) -> None:
    async with open_api(max_upload_bytes=1000) as api:
        response = await post(api, npy(np.zeros(1000, dtype=np.float32)))
        assert response.status_code == 413
        assert object_store.total_bytes() == (0, 0)
        assert uploads(api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_presign_needs_an_s3_store(store_api: Api) -> None:
    response = await post(store_api, b"", presign="true")
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("presign: needs an S3 object store")
    assert uploads(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["s3"], indirect=True)
async def test_presign_answers_a_url_that_takes_the_npy(
    store_api: Api, object_store: ObjectStore
) -> None:
    response = await post(store_api, b"", presign="true")
    assert response.status_code == 201, response.text
    out = response.json()
    assert out["upload_url"].startswith("http")
    assert (out["size"], out["dtype"], out["shape"]) == (None, None, None)
    upload_id = keys.parse_upload_uri(out["uri"])
    assert upload_id is not None
    async with httpx.AsyncClient() as outside:
        put = await outside.put(out["upload_url"], content=npy(X))
    assert put.status_code in (200, 201), put.text
    assert bytes(object_store.get(keys.upload_key("default", upload_id))) == npy(X)
    with store_api.sessions() as session:
        row = session.get(Upload, upload_id)
        assert row is not None and row.size is None


@pytest.mark.parametrize("object_store_url", ["s3"], indirect=True)
async def test_presign_takes_no_body(store_api: Api) -> None:
    response = await post(store_api, npy(X), presign="true")
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("body: must be empty")


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_store_that_fails_is_503_and_nothing_is_recorded(
    store_api: Api, object_store_url: str
) -> None:
    root = Path(object_store_url.removeprefix("file://"))
    shutil.rmtree(root)
    root.write_bytes(b"a file where the store's directory was")
    response = await post(store_api, npy(X))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "object_store_unavailable"
    assert uploads(store_api.sessions) == 0


async def test_uploads_take_a_key(open_api: OpenApi) -> None:
    async with open_api(auth=True) as api:
        response = await api.client.post(
            "/v1/uploads",
            content=npy(X),
            headers={"Content-Type": tensors.NPY, "Authorization": "Bearer nope"},
        )
        assert response.status_code == 401
