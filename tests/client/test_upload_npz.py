"""`Client.upload` of a dict of arrays: one .npz upload (what np.savez writes), whose arrays jobs
name by `<uri>/<name>`, or by the URI for an input of the same name. On a scripted transport,
then through the real API in-process (its store a directory), a fake worker reading the member
from the .npz object as the worker does."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from tests.client.fleet import samples
from tests.client.test_objects import (  # noqa: F401 (in_process, store_url: fixtures)
    BIG,
    URI,
    Server,
    finish_storing,
    in_process,
    store_url,
)
from tffleet import AsyncClient, tensors
from tffleet.objectstore import open_store


def test_a_dict_of_arrays_goes_as_one_npz_and_returns_its_uri() -> None:
    ids = np.arange(10, dtype=np.int64)
    server = Server()
    with server.client() as client:
        assert client.upload({"x": BIG, "ids": ids}) == URI

    (request,) = server.requests
    assert request.headers["content-type"] == tensors.NPZ
    assert int(request.headers["content-length"]) == len(request.content)
    with np.load(io.BytesIO(request.content), allow_pickle=False) as archive:
        np.testing.assert_array_equal(archive["x"], BIG)
        np.testing.assert_array_equal(archive["ids"], ids)
    assert server.streamed == [True]


def test_an_npz_upload_sent_again_after_a_503_sends_the_whole_body_again() -> None:
    answers = iter([httpx.Response(503, json={"error": {"code": "unavailable", "message": "x"}})])

    def upload(request: httpx.Request) -> httpx.Response:
        return next(answers, httpx.Response(201, json={"uri": URI}))

    server = Server({"/v1/uploads": upload})
    with server.client() as client:
        assert client.upload({"x": BIG}) == URI

    first, second = server.requests
    assert first.content == second.content == tensors.write_npz({"x": BIG})


@pytest.mark.anyio
async def test_the_jobs_take_the_arrays_of_an_npz_upload_through_the_real_api(
    in_process: tuple[AsyncClient, list[httpx.Request]],  # noqa: F811
    sqlite_url: str,
    redis_url: str,
    store_url: str,  # noqa: F811
) -> None:
    client, _ = in_process
    other = samples(3)
    uri = await client.upload({"x": BIG, "other": other})
    assert uri.startswith("tffleet://uploads/")
    store = open_store(store_url)
    for inputs, expected in [({"x": {"uri": uri}}, BIG), ({"x": {"uri": f"{uri}/other"}}, other)]:
        job = await client.submit("double", inputs)
        finish_storing(sqlite_url, redis_url, store, job.id)
        done = await client.wait(job.id, timeout=20)
        assert done.ok and done.outputs is not None
        np.testing.assert_array_equal(done.outputs["y"], expected * 2)
