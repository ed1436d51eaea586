"""POST /v1/uploads: an .npy streamed into the object store (a directory, and a real S3 server),
the row that records it, and the bodies it refuses leaving neither object nor row."""

from __future__ import annotations

import io
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from db import jobs
from db.models import JobUpload, ObjectGarbage, Upload
from tests.api.conftest import (
    Api,
    OpenApi,
    count_jobs,
    count_uploads,
    created_uri,
    envelope,
    finish_job,
    inputs_of,
    read_job,
)
from tffleet import tensors
from tffleet.objectstore import ObjectStore, keys
from worker import garbage

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

X = np.arange(24, dtype=np.float32).reshape(6, 4)


def npy(array: np.ndarray) -> bytes:
    """What np.save writes: numpy's writer, not ours."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


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
    assert count_uploads(store_api.sessions) == 0


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
    assert count_uploads(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_other_types_are_415(store_api: Api) -> None:
    response = await post(store_api, b"{}", media="application/json")
    assert response.status_code == 415
    assert tensors.NPY in response.json()["error"]["message"]


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_body_over_the_upload_limit_is_413(
    object_store: ObjectStore, open_api: OpenApi
) -> None:
    async with open_api(max_upload_bytes=1000) as api:
        response = await post(api, npy(np.zeros(1000, dtype=np.float32)))
        assert response.status_code == 413
        assert object_store.total_bytes() == (0, 0)
        assert count_uploads(api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_presign_needs_an_s3_store(store_api: Api) -> None:
    response = await post(store_api, b"", presign="true")
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("presign: needs an S3 object store")
    assert count_uploads(store_api.sessions) == 0


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
    assert count_uploads(store_api.sessions) == 0


async def test_uploads_take_a_key(open_api: OpenApi) -> None:
    async with open_api(auth=True) as api:
        response = await api.client.post(
            "/v1/uploads",
            content=npy(X),
            headers={"Content-Type": tensors.NPY, "Authorization": "Bearer nope"},
        )
        assert response.status_code == 401


# ─── References at submit ─────────────────────────────────────────────────────────────────────────


async def uploaded(api: Api, array: np.ndarray, headers: dict[str, str] | None = None) -> str:
    response = await api.client.post(
        "/v1/uploads", content=npy(array), headers={"Content-Type": tensors.NPY, **(headers or {})}
    )
    return created_uri(response)


async def test_a_job_names_an_upload_by_uri(store_api: Api, object_store: ObjectStore) -> None:
    uri = await uploaded(store_api, X)
    response = await store_api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": {"uri": uri}}}
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    blob = read_job(store_api.sessions, job_id).inputs
    upload_id = keys.parse_upload_uri(uri)
    assert upload_id is not None
    ref = tensors.references(blob)["x"]
    assert (ref.key, ref.dtype, ref.shape, ref.nbytes) == (
        keys.upload_key("default", upload_id), "float32", (6, 4), X.nbytes
    )  # fmt: skip
    assert ref.offset == len(npy(X)) - X.nbytes
    np.testing.assert_array_equal(inputs_of(store_api, job_id, object_store)["x"], X)
    with store_api.sessions() as session:
        assert session.scalars(
            select(JobUpload.upload_id).where(JobUpload.job_id == job_id)
        ).all() == [upload_id]


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_bulk_request_mixes_uris_and_inline_tensors(
    store_api: Api, object_store: ObjectStore
) -> None:
    uri = await uploaded(store_api, X[:2])
    pair = {"a": [[1, 2, 3], [4, 5, 6]], "b": {"uri": await uploaded(store_api, X[:2, :2])}}
    body = {
        "jobs": [{"model": "pair", "inputs": pair}, {"model": "mlp", "inputs": {"x": {"uri": uri}}}]
    }
    response = await store_api.client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    first, second = (job["id"] for job in response.json()["jobs"])
    pair = inputs_of(store_api, first, object_store)
    np.testing.assert_array_equal(pair["b"], X[:2, :2])
    np.testing.assert_array_equal(pair["a"], [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(inputs_of(store_api, second, object_store)["x"], X[:2])


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"uri": "tffleet://uploads/" + "0" * 32}, "no upload tffleet://uploads/000"),
        ({"uri": "tffleet://uploads/nothex"}, "is no upload URI"),
        ({"uri": "https://example.com/x.npy"}, "https:// URIs are not fetched"),
        ({"uri": "s3://bucket/x.npy"}, "s3:// URIs are not fetched"),
        ({"uri": 7}, "a reference is"),
        ({"uri": "tffleet://uploads/" + "0" * 32, "dtype": "float32"}, "a reference is"),
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_uri_that_names_no_upload_is_422_naming_the_input(
    store_api: Api, value: dict[str, Any], says: str
) -> None:
    response = await store_api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": value}}
    )
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("inputs.x: ") and says in message, message
    assert count_jobs(store_api.sessions) == 0


@pytest.mark.parametrize(
    ("array", "says"),
    [
        (X.astype(np.float64), "expected dtype float32, got float64"),
        (X[:, :3], "dimension 1 must be 4"),
        (X[0], "expected rank 2"),
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_an_upload_that_does_not_fit_the_signature_is_422(
    store_api: Api, array: np.ndarray, says: str
) -> None:
    uri = await uploaded(store_api, array)
    body = {
        "jobs": [
            {"model": "mlp", "inputs": {"x": X.tolist()}},
            {"model": "mlp", "inputs": {"x": {"uri": uri}}},
        ]
    }
    response = await store_api.client.post("/v1/jobs", json=body)
    assert response.status_code == 422
    message = response.json()["error"]["message"]
    assert message.startswith("jobs[1]: inputs.x: ") and says in message, message
    assert count_jobs(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_an_expired_upload_names_nothing(store_api: Api) -> None:
    uri = await uploaded(store_api, X)
    expire_uploads(store_api.sessions)
    job = {"model": "mlp", "inputs": {"x": {"uri": uri}}}
    response = await store_api.client.post("/v1/jobs", json=job)
    assert response.status_code == 422
    assert "(unknown, expired, or another tenant's)" in response.json()["error"]["message"]


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_another_tenants_upload_names_nothing(store_api: Api) -> None:
    uri = await uploaded(store_api, X, store_api.key("acme"))
    response = await store_api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": {"uri": uri}}}
    )
    assert response.status_code == 422
    assert "another tenant's" in response.json()["error"]["message"]
    assert count_jobs(store_api.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["s3"], indirect=True)
async def test_a_presigned_upload_is_checked_at_its_first_reference(store_api: Api) -> None:
    out = (await post(store_api, b"", presign="true")).json()
    job = {"model": "mlp", "inputs": {"x": {"uri": out["uri"]}}}
    response = await store_api.client.post("/v1/jobs", json=job)
    assert response.status_code == 422
    assert "holds nothing yet" in response.json()["error"]["message"]
    async with httpx.AsyncClient() as outside:
        assert (await outside.put(out["upload_url"], content=npy(X))).status_code in (200, 201)
    response = await store_api.client.post("/v1/jobs", json=job)
    assert response.status_code == 202, response.text
    with store_api.sessions() as session:
        row = session.get(Upload, keys.parse_upload_uri(out["uri"]))
        assert row is not None
        assert (row.size, row.dtype, row.shape) == (len(npy(X)), "float32", [6, 4])


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_replay_of_a_keyed_request_with_a_uri_finds_its_job(store_api: Api) -> None:
    uri = await uploaded(store_api, X)
    job = {"model": "mlp", "inputs": {"x": {"uri": uri}}}
    headers = {"Idempotency-Key": "ref-1"}
    first = await store_api.client.post("/v1/jobs", json=job, headers=headers)
    again = await store_api.client.post("/v1/jobs", json=job, headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    # Equal bytes under another upload are another request.
    other = {"model": "mlp", "inputs": {"x": {"uri": await uploaded(store_api, X)}}}
    assert (await store_api.client.post("/v1/jobs", json=other, headers=headers)).status_code == 409


# ─── Large inline inputs go to the store ──────────────────────────────────────────────────────────


@pytest.fixture
async def small_inline(object_store: ObjectStore, open_api: OpenApi) -> AsyncIterator[Api]:
    """Inputs over 64 bytes go to the store."""
    async with open_api(inline_max_bytes=64) as running:
        yield running


async def test_an_input_over_the_inline_limit_is_an_object_of_its_job(
    small_inline: Api, object_store: ObjectStore
) -> None:
    big = np.arange(48, dtype=np.float32).reshape(16, 3)
    body = {"model": "pair", "inputs": {"a": envelope(big), "b": np.ones((16, 2)).tolist()}}
    response = await small_inline.client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    job = read_job(small_inline.sessions, job_id)
    refs = tensors.references(job.inputs)
    assert list(refs) == ["a", "b"]  # 16*3*4 and 16*2*4 bytes, both over 64
    assert refs["a"].key == keys.input_key("default", job_id, "a")
    assert job.stored_bytes == sum(object_store.size(ref.key) or 0 for ref in refs.values())
    arrays = inputs_of(small_inline, job_id, object_store)
    np.testing.assert_array_equal(arrays["a"], big)
    np.testing.assert_array_equal(arrays["b"], np.ones((16, 2)))
    # The object is an .npy as np.load reads it.
    np.testing.assert_array_equal(np.load(io.BytesIO(bytes(object_store.get(refs["a"].key)))), big)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_replayed_request_keeps_one_set_of_objects(
    small_inline: Api, object_store: ObjectStore
) -> None:
    body = {"model": "mlp", "inputs": {"x": envelope(X)}}  # 96 bytes
    headers = {"Idempotency-Key": "big-1"}
    first = await small_inline.client.post("/v1/jobs", json=body, headers=headers)
    again = await small_inline.client.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == again.status_code == 202, again.text
    assert first.json()["id"] == again.json()["id"]
    assert object_store.total_bytes()[0] == 1
    changed = {"model": "mlp", "inputs": {"x": envelope(X + 1)}}
    assert (
        await small_inline.client.post("/v1/jobs", json=changed, headers=headers)
    ).status_code == 409
    assert object_store.total_bytes()[0] == 1


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_binary_body_over_the_inline_limit_goes_to_the_store(
    small_inline: Api, object_store: ObjectStore
) -> None:
    response = await small_inline.client.post(
        "/v1/jobs", content=npy(X), headers={"Content-Type": tensors.NPY}, params={"model": "mlp"}
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    np.testing.assert_array_equal(inputs_of(small_inline, job_id, object_store)["x"], X)
    assert object_store.total_bytes()[0] == 1


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_store_that_fails_at_submit_is_503_with_no_job(
    small_inline: Api, object_store_url: str
) -> None:
    root = Path(object_store_url.removeprefix("file://"))
    shutil.rmtree(root)
    root.write_bytes(b"a file where the store's directory was")
    response = await small_inline.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": envelope(X)}}
    )
    assert response.status_code == 503
    assert count_jobs(small_inline.sessions) == 0


# ─── Garbage: what goes with the rows ─────────────────────────────────────────────────────────────


def expire_uploads(sessions: Sessions) -> None:
    with sessions.begin() as session:
        session.execute(update(Upload).values(expires_at=datetime(2000, 1, 1, tzinfo=UTC)))


def garbage_rows(sessions: Sessions) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(ObjectGarbage)) or 0)


async def test_deleted_and_purged_jobs_and_expired_uploads_leave_no_object(
    small_inline: Api, object_store: ObjectStore
) -> None:
    sessions = small_inline.sessions
    uri = await uploaded(small_inline, X)
    ids = []
    for inputs in ({"x": {"uri": uri}}, {"x": envelope(X)}, {"x": envelope(X + 1)}):
        response = await small_inline.client.post(
            "/v1/jobs", json={"model": "mlp", "inputs": inputs}
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    deleted = ids[1]
    assert object_store.total_bytes()[0] == 3  # the upload, two jobs' inputs
    for job_id in ids:
        finish_job(sessions, job_id, {"y": np.zeros((6, 2), dtype=np.float32)})
    assert (await small_inline.client.delete(f"/v1/jobs/{deleted}")).status_code == 204
    with sessions.begin() as session:
        far = datetime(2100, 1, 1, tzinfo=UTC)
        assert jobs.purge_finished(session=session, older_than=far, limit=10) == 2
    expire_uploads(sessions)
    assert object_store.total_bytes()[0] == 3  # nothing goes before the sweep

    report = garbage.collect(sessions, lambda: object_store)

    assert (report.uploads_purged, report.objects_deleted) == (1, 3)
    assert object_store.total_bytes() == (0, 0)
    assert garbage_rows(sessions) == 0
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Upload)) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_an_upload_stays_while_a_job_keeping_its_inputs_names_it(
    store_api: Api, object_store: ObjectStore
) -> None:
    uri = await uploaded(store_api, X)
    response = await store_api.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": {"uri": uri}}}
    )
    assert response.status_code == 202
    expire_uploads(store_api.sessions)
    assert garbage.collect(store_api.sessions, lambda: object_store).uploads_purged == 0
    assert object_store.total_bytes()[0] == 1
    # Its job ends and its inputs go (TFFLEET_INPUT_TTL_S): the upload goes with the next sweep.
    finish_job(store_api.sessions, response.json()["id"], {"y": np.zeros((6, 2), dtype=np.float32)})
    with store_api.sessions.begin() as session:
        far = datetime(2100, 1, 1, tzinfo=UTC)
        jobs.purge_inputs(
            session=session, since=datetime(2000, 1, 1, tzinfo=UTC), older_than=far, limit=10
        )
    assert garbage.collect(store_api.sessions, lambda: object_store).uploads_purged == 1
    assert object_store.total_bytes() == (0, 0)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_store_that_fails_keeps_the_garbage_for_the_next_sweep(
    small_inline: Api, object_store: ObjectStore, object_store_url: str
) -> None:
    response = await small_inline.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": envelope(X)}}
    )
    job_id = response.json()["id"]
    finish_job(small_inline.sessions, job_id, {"y": np.zeros((6, 2), dtype=np.float32)})
    assert (await small_inline.client.delete(f"/v1/jobs/{job_id}")).status_code == 204
    root = Path(object_store_url.removeprefix("file://"))
    kept = root.with_name("kept")
    root.rename(kept)
    root.write_bytes(b"a file where the store's directory was")

    assert garbage.collect(small_inline.sessions, lambda: object_store).store_unavailable
    assert garbage_rows(small_inline.sessions) == 1

    root.unlink()
    kept.rename(root)
    assert garbage.collect(small_inline.sessions, lambda: object_store).objects_deleted == 1
    assert object_store.total_bytes() == (0, 0)
    assert garbage_rows(small_inline.sessions) == 0


# ─── A large .npy body streamed into the store ────────────────────────────────────────────────────


async def post_npy(api: Api, body: bytes | Any, **params: Any) -> httpx.Response:
    return await api.client.post(
        "/v1/jobs",
        content=body,
        headers={"Content-Type": tensors.NPY},
        params={"model": "mlp", **params},
    )


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_large_npy_body_is_streamed_into_the_store_as_it_came(
    small_inline: Api, object_store: ObjectStore
) -> None:
    body = npy(X)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: streamed too
        yield body[:50]
        yield body[50:]

    for sent in (body, chunks()):
        response = await post_npy(small_inline, sent)
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        job = read_job(small_inline.sessions, job_id)
        ref = tensors.references(job.inputs)["x"]
        key = keys.input_key("default", job_id, "x")
        # The body itself, header and all: np.save's, not rewritten.
        assert (ref.key, ref.offset, job.stored_bytes) == (key, len(body) - X.nbytes, len(body))
        assert bytes(object_store.get(key)) == body
        np.testing.assert_array_equal(inputs_of(small_inline, job_id, object_store)["x"], X)


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_large_npy_body_to_be_cast_is_read_whole_and_cast(
    small_inline: Api, object_store: ObjectStore
) -> None:
    response = await post_npy(small_inline, npy(X.astype(np.float64)))
    assert response.status_code == 202, response.text
    arrays = inputs_of(small_inline, response.json()["id"], object_store)
    assert arrays["x"].dtype == np.float32
    np.testing.assert_array_equal(arrays["x"], X)


@pytest.mark.parametrize(
    ("body", "params", "status", "says"),
    [
        (npy(X[:, :3]), {}, 422, "inputs.x: dimension 1 must be 4"),
        (npy(X)[:-4], {}, 400, "body: holds 92 bytes"),
        (npy(X), {"priority": 999}, 422, "priority: at most 10"),  # after it was streamed
    ],
)
@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_a_streamed_body_refused_leaves_nothing(
    small_inline: Api,
    object_store: ObjectStore,
    body: bytes,
    params: dict[str, Any],
    status: int,
    says: str,
) -> None:
    response = await post_npy(small_inline, body, **params)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]
    assert object_store.total_bytes() == (0, 0)
    assert count_jobs(small_inline.sessions) == 0


@pytest.mark.parametrize("object_store_url", ["file"], indirect=True)
async def test_the_same_tensor_as_json_or_a_streamed_body_is_one_request(
    small_inline: Api, object_store: ObjectStore
) -> None:
    headers = {"Idempotency-Key": "same-1"}
    first = await small_inline.client.post(
        "/v1/jobs", json={"model": "mlp", "inputs": {"x": envelope(X)}}, headers=headers
    )
    again = await small_inline.client.post(
        "/v1/jobs",
        content=npy(X),
        headers={"Content-Type": tensors.NPY, **headers},
        params={"model": "mlp"},
    )
    assert first.status_code == again.status_code == 202, again.text
    assert first.json()["id"] == again.json()["id"]
    assert object_store.total_bytes()[0] == 1  # the replay's streamed object went again
