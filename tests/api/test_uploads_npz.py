"""POST /v1/uploads of an .npz: streamed into the store as one object (a directory, and a real S3
server), its members found by ranged reads and recorded, jobs naming a member by URI with a
reference into that object; bodies that are no fit leave neither object nor row."""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from db.models import Upload
from tests.api.conftest import (
    Api,
    OpenApi,
    count_jobs,
    count_uploads,
    created_uri,
    inputs_of,
    read_job,
)
from tffleet import tensors
from tffleet.objectstore import ObjectStore, keys

pytestmark = pytest.mark.anyio

X = np.arange(24, dtype=np.float32).reshape(6, 4)
A = np.arange(12, dtype=np.float32).reshape(4, 3)
B = np.ones((4, 2), dtype=np.float32)


def savez(compressed: bool = False, **arrays: Any) -> bytes:
    """What np.savez (or np.savez_compressed) writes: numpy's writer, not ours."""
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


async def post(api: Api, body: bytes, media: str = tensors.NPZ) -> httpx.Response:
    return await api.client.post("/v1/uploads", content=body, headers={"Content-Type": media})


async def uploaded(api: Api, **arrays: np.ndarray) -> str:
    response = await post(api, savez(**arrays))
    return created_uri(response)


async def test_an_npz_is_stored_whole_and_its_members_recorded(
    store_api: Api, object_store: ObjectStore
) -> None:
    body = savez(x=X, ids=np.arange(5, dtype=np.int64), flag=np.array(True))
    response = await post(store_api, body)
    assert response.status_code == 201, response.text
    out = response.json()
    assert (out["dtype"], out["shape"], out["size"]) == (None, None, len(body))
    assert out["members"] == {
        "x": {"dtype": "float32", "shape": [6, 4]},
        "ids": {"dtype": "int64", "shape": [5]},
        "flag": {"dtype": "bool", "shape": []},
    }
    upload_id = keys.parse_upload_uri(out["uri"])
    assert upload_id is not None
    key = keys.upload_key("default", upload_id, "npz")
    stored = bytes(object_store.get(key))
    assert stored == body
    with store_api.sessions() as session:
        row = session.get(Upload, upload_id)
        assert row is not None and row.key == key and row.members is not None
        members = row.members
    # Each member's offset and length are its data's, in the object as it lies.
    for name, array in {"x": X, "ids": np.arange(5), "flag": np.array(True)}.items():
        member = members[name]
        assert member["nbytes"] == array.nbytes
        data = stored[member["offset"] : member["offset"] + member["nbytes"]]
        np.testing.assert_array_equal(
            np.frombuffer(data, dtype=member["dtype"]).reshape(member["shape"]), array
        )


async def test_a_job_takes_the_member_named_as_its_input(
    store_api: Api, object_store: ObjectStore
) -> None:
    uri = await uploaded(store_api, x=X, other=X[:2])
    response = await store_api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": {"uri": uri}}}
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    ref = tensors.references(read_job(store_api.sessions, job_id).inputs)["x"]
    upload_id = keys.parse_upload_uri(uri)
    assert upload_id is not None
    assert (ref.key, ref.dtype, ref.shape, ref.nbytes) == (
        keys.upload_key("default", upload_id, "npz"), "float32", (6, 4), X.nbytes
    )  # fmt: skip
    np.testing.assert_array_equal(inputs_of(store_api, job_id, object_store)["x"], X)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_uri_names_a_member_explicitly(store_api: Api, object_store: ObjectStore) -> None:
    uri = await uploaded(store_api, a=A, b=B, other=X[:2])
    body = {
        "jobs": [
            {"model": "mlp", "inputs": {"x": {"uri": f"{uri}/other"}}},
            {"model": "pair", "inputs": {"a": {"uri": uri}, "b": {"uri": f"{uri}/b"}}},
        ]
    }
    response = await store_api.client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    first, second = (job["id"] for job in response.json()["jobs"])
    np.testing.assert_array_equal(inputs_of(store_api, first, object_store)["x"], X[:2])
    pair = inputs_of(store_api, second, object_store)
    np.testing.assert_array_equal(pair["a"], A)
    np.testing.assert_array_equal(pair["b"], B)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_member_that_is_not_there_is_422_naming_the_input(store_api: Api) -> None:
    uri = await uploaded(store_api, a=A)
    for value, says in [
        ({"uri": uri}, "holds no member 'x' (it holds a)"),
        ({"uri": f"{uri}/nope"}, "holds no member 'nope'"),
        ({"uri": f"{uri}/"}, "is no upload URI"),
        ({"uri": f"{uri}/a"}, "expected dtype float32"),  # there, but of another shape
    ]:
        response = await store_api.client.post(
            "/v1/jobs", json={"model": "mlp", "inputs": {"x": value}}
        )
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
        assert message.startswith("inputs.x: ") and (says in message or "dimension" in message)
    assert count_jobs(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_member_of_an_npy_upload_is_422(store_api: Api) -> None:
    buffer = io.BytesIO()
    np.save(buffer, X)
    response = await post(store_api, buffer.getvalue(), media=tensors.NPY)
    uri = response.json()["uri"]
    response = await store_api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": {"uri": f"{uri}/x"}}}
    )
    assert response.status_code == 422
    assert "is one array (an .npy), not an .npz" in response.json()["error"]["message"]


def mixed() -> bytes:
    """A zip whose first member is stored and second compressed: found only from its directory."""
    first, second = (savez(x=X), savez(compressed=True, y=X))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as out:
        for source in (first, second):
            with zipfile.ZipFile(io.BytesIO(source)) as archive:
                for info in archive.infolist():
                    out.writestr(info, archive.read(info), compress_type=info.compress_type)
    return buffer.getvalue()


def pickled() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([object()], dtype=object))
    return buffer.getvalue()


def misnamed() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as out:
        out.writestr("x.txt", b"not an array")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "not an .npz archive"),
        (b"not a zip at all, just some bytes here", "not an .npz archive"),
        (savez(compressed=True, x=X), "np.savez_compressed"),
        (mixed(), "member 'y.npy' is compressed"),
        (savez(x=X)[:-30], "not an .npz archive"),  # its directory cut short
        (savez(x=X)[:200], "not an .npz archive"),
        (pickled(), "pickle"),
        (savez(x=np.array(["a", "b"])), "strings inline"),
        (savez(x=X.astype(">f4")), "big-endian"),
        (savez(x=np.asfortranarray(X)), "Fortran"),
        (misnamed(), "member 'x.txt' is not an .npy"),
        (savez(), "not an .npz archive"),  # no arrays: no local header at its start
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_an_npz_that_is_no_fit_leaves_nothing(
    store_api: Api, object_store: ObjectStore, body: bytes, says: str
) -> None:
    response = await post(store_api, body)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("body: ") and says in message, message
    assert object_store.total_bytes() == (0, 0)
    assert count_uploads(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["s3"], indirect=True)
async def test_a_compressed_member_found_late_leaves_nothing_on_s3(
    store_api: Api, object_store: ObjectStore
) -> None:
    response = await post(store_api, mixed())
    assert response.status_code == 422
    assert object_store.total_bytes() == (0, 0)
    assert count_uploads(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_an_npz_over_the_upload_limit_is_413(
    object_store: ObjectStore, open_api: OpenApi
) -> None:
    async with open_api(max_upload_bytes=1000) as api:
        body = savez(x=np.zeros(1000, dtype=np.float32))
        response = await post(api, body)
        assert response.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: found as it streams
            yield body[:100]
            yield body[100:]

        response = await api.client.post(
            "/v1/uploads", content=chunks(), headers={"Content-Type": tensors.NPZ}
        )
        assert response.status_code == 413
        assert object_store.total_bytes() == (0, 0)
        assert count_uploads(api.sessions) == 0


def padded(**arrays: np.ndarray) -> bytes:
    """An .npz whose members' local headers carry a 1000-byte extra field (an id no reader
    knows): their .npy headers lie past what is read with the local header at first."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as out:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy")
            info.extra = struct.pack("<HH", 0xCAFE, 1000) + b"\0" * 1000
            npy = io.BytesIO()
            np.save(npy, array)
            out.writestr(info, npy.getvalue())
    return buffer.getvalue()


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_many_members_and_headers_read_late_are_indexed(
    store_api: Api, object_store: ObjectStore
) -> None:
    arrays = {f"m{i}": np.full((i + 1,), i, dtype=np.int16) for i in range(300)}
    response = await post(store_api, savez(**arrays))
    assert response.status_code == 201, response.text
    members = response.json()["members"]
    assert len(members) == 300 and members["m299"] == {"dtype": "int16", "shape": [300]}
    uri = (await post(store_api, padded(x=X, other=X[:1]))).json()["uri"]
    response = await store_api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": {"uri": uri}}}
    )
    assert response.status_code == 202, response.text
    np.testing.assert_array_equal(inputs_of(store_api, response.json()["id"], object_store)["x"], X)
