"""The Open Inference Protocol (v2) over the job queue: health, metadata, readiness, config and
infer with JSON tensors and with the binary tensor data extension, on the real app, database
and Redis, with a fake worker finishing the jobs. Requests are built, and answers read, by
tritonclient's own code (`_get_inference_request`, `InferResult.from_response_body`).

The real client against the real worker and TensorFlow: tests/e2e/test_oip.py.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from tritonclient.http import InferInput, InferRequestedOutput, InferResult
from tritonclient.http._utils import _get_inference_request

from api.protocols.oip import binary as oip_binary
from db import registry
from db.models import Job, PresenceState
from tests.api.conftest import (
    DEAD_BROKER_URL,
    Api,
    OpenApi,
    assert_nothing_left,
    count_jobs,
    fake_worker,
    read_job,
)
from tests.api.test_models import report

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]

# A model with several inputs and outputs of several datatypes, and one of strings.
MIXED = (
    {
        "x": {"dtype": "float32", "shape": [-1, 3]},
        "k": {"dtype": "int64", "shape": [-1]},
        "flag": {"dtype": "bool", "shape": [-1]},
    },
    {
        "y": {"dtype": "float32", "shape": [-1, 2]},
        "k2": {"dtype": "int64", "shape": [-1]},
        "negative": {"dtype": "bool", "shape": [-1]},
    },
)
TEXT = ({"text": {"dtype": "string", "shape": [-1]}}, {"echo": {"dtype": "string", "shape": [-1]}})
WEIGHTS = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5


def mixed(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "y": inputs["x"] @ WEIGHTS,
        "k2": 2 * inputs["k"] + inputs["flag"].astype(np.int64),
        "negative": (inputs["x"] < 0).any(axis=1),
    }


def echo(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"echo": inputs["text"]}


@pytest.fixture
def oip_models(sessions: Sessions, models: dict[str, Any]) -> None:
    with sessions.begin() as session:
        for name, (inputs, outputs) in {"mixed": MIXED, "text": TEXT}.items():
            registry.register(
                session=session, name=name, version=1, format="saved_model", inputs=inputs,
                outputs=outputs, config={"max_batch_size": 8},
            )  # fmt: skip


def sample(n: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "x": rng.normal(size=(n, 3)).astype(np.float32),
        "k": np.arange(n, dtype=np.int64) * 7 - 3,
        "flag": np.array([True, False, True][:n]),
    }


_DATATYPE = {"float32": "FP32", "int64": "INT64", "bool": "BOOL", "object": "BYTES"}


def request_of(
    arrays: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    outputs: list[tuple[str, bool]] | None = None,
    **kwargs: Any,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers tritonclient.http sends for these inputs."""
    inputs = []
    for name, array in arrays.items():
        item = InferInput(name, list(array.shape), _DATATYPE[array.dtype.name])
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    requested = [InferRequestedOutput(name, binary_data=b) for name, b in outputs or []]
    body, header_length = _get_inference_request(
        inputs=inputs,
        request_id=kwargs.pop("request_id", ""),
        outputs=requested,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=kwargs.pop("timeout", None),
        custom_parameters=kwargs.pop("parameters", None),
    )
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    return body, headers


def result_of(response: Any) -> InferResult:
    assert response.status_code == 200, response.text
    return InferResult.from_response_body(
        response.content, header_length=response.headers.get("Inference-Header-Content-Length")
    )


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
async def test_infer_answers_every_output_as_the_model_computes_it(
    api: Api, sessions: Sessions, redis_url: str, oip_models: None, binary: bool
) -> None:
    arrays = sample()
    body, headers = request_of(arrays, binary=binary, request_id="r-1")

    with fake_worker(sessions, redis_url, mixed) as done:
        response = await api.client.post("/v2/models/mixed/infer", content=body, headers=headers)

    result = result_of(response)
    answer = result.get_response()
    assert answer["model_name"] == "mixed" and answer["model_version"] == "1"
    assert answer["id"] == "r-1"
    (job_id,) = done
    assert answer["parameters"] == {"tffleet_job_id": job_id}
    expected = mixed(arrays)
    assert [o["name"] for o in answer["outputs"]] == sorted(expected)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # No outputs named: tritonclient asks for all of them as binary data.
    assert ("Inference-Header-Content-Length" in response.headers) is True
    assert read_job(sessions, job_id).status == "succeeded"


async def test_requested_outputs_come_in_their_order_each_binary_or_json_as_asked(
    api: Api, sessions: Sessions, redis_url: str, oip_models: None
) -> None:
    arrays = sample(2)
    body, headers = request_of(arrays, outputs=[("k2", False), ("y", True)])

    with fake_worker(sessions, redis_url, mixed):
        response = await api.client.post(
            "/v2/models/mixed/versions/1/infer", content=body, headers=headers
        )

    result = result_of(response)
    k2, y = result.get_response()["outputs"]
    assert k2 == {
        "name": "k2", "datatype": "INT64", "shape": [2],
        "data": mixed(arrays)["k2"].tolist(),
    }  # fmt: skip
    assert y["name"] == "y" and y["parameters"] == {"binary_data_size": 2 * 2 * 4}
    np.testing.assert_allclose(result.as_numpy("y"), mixed(arrays)["y"], rtol=1e-6)


async def test_a_plain_json_request_needs_no_binary_header_and_gets_a_json_answer(
    api: Api, sessions: Sessions, redis_url: str, oip_models: None
) -> None:
    # As the protocol's own example, written by hand: data nested as the shape, or flat.
    request = {
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, -6]]},
            {"name": "k", "shape": [2], "datatype": "INT64", "data": [1, 2]},
            {"name": "flag", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        ],
        "outputs": [{"name": "negative"}],
    }
    with fake_worker(sessions, redis_url, mixed):
        response = await api.client.post("/v2/models/mixed/infer", json=request)

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["outputs"] == [
        {"name": "negative", "datatype": "BOOL", "shape": [2], "data": [False, True]}
    ]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
async def test_bytes_tensors_carry_any_bytes_as_binary_and_utf8_as_json(
    api: Api, sessions: Sessions, redis_url: str, oip_models: None, binary: bool
) -> None:
    words = [b"caf\xc3\xa9", b"", b"end\x00"] if binary else [b"caf\xc3\xa9", b"", b"z"]
    arrays = {"text": np.array(words, dtype=object)}
    body, headers = request_of(arrays, binary=binary, outputs=[("echo", binary)])

    with fake_worker(sessions, redis_url, echo):
        response = await api.client.post("/v2/models/text/infer", content=body, headers=headers)

    got = result_of(response).as_numpy("echo").tolist()
    # tritonclient reads BYTES given as JSON as str, given as binary data as bytes.
    assert got == (words if binary else [word.decode() for word in words])


async def test_bytes_that_are_not_utf8_asked_for_as_json_get_400_naming_binary_data(
    api: Api, sessions: Sessions, redis_url: str, oip_models: None
) -> None:
    arrays = {"text": np.array([b"\xff"], dtype=object)}
    body, headers = request_of(arrays, outputs=[("echo", False)])

    with fake_worker(sessions, redis_url, echo):
        response = await api.client.post("/v2/models/text/infer", content=body, headers=headers)

    assert response.status_code == 400
    assert "binary_data" in response.json()["error"]


async def test_the_timeout_parameter_shortens_the_wait_and_cancels_the_job_at_it(
    api: Api, sessions: Sessions, oip_models: None
) -> None:
    body, headers = request_of(sample(1), timeout=300_000)  # microseconds
    started = time.monotonic()
    response = await api.client.post("/v2/models/mixed/infer", content=body, headers=headers)

    assert 0.25 <= time.monotonic() - started < 5
    assert response.status_code == 504
    (job,) = _jobs(sessions)
    assert job.id in response.json()["error"] and job.deadline_at is not None
    assert "it is canceled" in response.json()["error"]


def _jobs(sessions: Sessions) -> list[Job]:
    with sessions() as session:
        return list(session.scalars(select(Job)))


async def test_past_the_wait_the_answer_is_504_naming_a_job_the_caller_can_poll(
    open_api: OpenApi, sessions: Sessions, oip_models: None
) -> None:
    async with open_api(protocol_wait_s=0.3) as api:
        acme = api.key("acme")
        body, headers = request_of(sample(1))
        response = await api.client.post(
            "/v2/models/mixed/infer", content=body, headers={**headers, **acme}
        )

        assert response.status_code == 504
        assert set(response.json()) == {"error"}
        (job,) = _jobs(sessions)
        assert job.id in response.json()["error"] and job.tenant == "acme"
        polled = await api.client.get(f"/v1/jobs/{job.id}", headers=acme)
        assert polled.status_code == 200 and polled.json()["status"] == "queued"
        other = await api.client.get(f"/v1/jobs/{job.id}", headers=api.key("other"))
        assert other.status_code == 404


def _binary_body(header: dict[str, Any], data: bytes) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(header)
    return head + data, {"Inference-Header-Content-Length": str(len(head))}


_X = {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
_K = {"name": "k", "shape": [1], "datatype": "INT64", "data": [1]}
_FLAG = {"name": "flag", "shape": [1], "datatype": "BOOL", "data": [True]}


def _json(*inputs: dict[str, Any], **rest: Any) -> tuple[bytes, dict[str, str]]:
    return orjson.dumps({"inputs": list(inputs), **rest}), {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        ((b"{", {}), "not valid JSON"),
        ((b"[]", {}), "body: expected a JSON object"),
        (_json(_X, _K, _FLAG, extra=1), "body: unknown keys ['extra']"),
        (_json(), "inputs: expected a non-empty list"),
        (_json(_X, _K, {**_FLAG, "name": "z"}), "inputs[2].name: model 'mixed' has no input 'z'"),
        (_json(_X, _K, _FLAG, _K), "inputs[3].name: input 'k' is given twice"),
        (_json(_X, _K), "inputs: missing ['flag']"),
        (_json({**_X, "datatype": "FP64"}, _K, _FLAG), "input 'x' is FP32, got FP64"),
        (_json({**_X, "datatype": "FP8"}, _K, _FLAG), "inputs[0].datatype: expected one of"),
        (_json({**_X, "shape": [1, 4]}, _K, _FLAG), "3 elements, the shape holds 4"),
        (_json({**_X, "shape": [3]}, _K, _FLAG), "inputs.x: expected rank 2"),
        (_json({**_X, "shape": [1, -3]}, _K, _FLAG), "inputs[0].shape: expected sizes >= 0"),
        (_json({**_X, "data": ["a", "b", "c"]}, _K, _FLAG), "inputs[0].data:"),
        (_json(_X, {**_K, "data": [1.5]}, _FLAG), "inputs[1].data:"),
        (_json({k: v for k, v in _X.items() if k != "data"}, _K, _FLAG), "inputs[0]: give `data`"),
        (_json(_X, _K, _FLAG, id=7), "id: expected a string"),
        (_json(_X, _K, _FLAG, outputs=[{"name": "nope"}]), "outputs[0].name: model 'mixed' has no"),
        (_json(_X, _K, _FLAG, outputs=[{"name": "y"}, {"name": "y"}]), "asked for twice"),
        (
            _json(_X, _K, _FLAG, outputs=[{"name": "y", "parameters": {"classification": 2}}]),
            "classification extension is not served",
        ),
        (
            _json({**_X, "parameters": {"shared_memory_region": "r"}}, _K, _FLAG),
            "inputs[0].parameters.shared_memory_region: the shared-memory extension",
        ),
        (_json(_X, _K, _FLAG, parameters={"sequence_id": 4}), "parameters.sequence_id: sequences"),
        (_json(_X, _K, _FLAG, parameters={"timeout": -1}), "parameters.timeout: expected"),
        (_json(_X, _K, _FLAG, parameters={"binary_data_output": "yes"}), "binary_data_output"),
        (_json({**_X, "data": None}, _K, _FLAG), "inputs[0].data:"),
        (
            _binary_body(
                {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                             "parameters": {"binary_data_size": 12}}, _K, _FLAG]},
                b"\x00" * 8,
            ),
            "binary_data_size: 12 bytes, but only 8 bytes",
        ),
        (
            _binary_body(
                {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                             "parameters": {"binary_data_size": 8}}, _K, _FLAG]},
                b"\x00" * 8,
            ),
            "the shape holds 3 elements of 4 bytes (12)",
        ),
        (
            _binary_body(
                {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32",
                             "parameters": {"binary_data_size": 12}}, _K, _FLAG]},
                b"\x00" * 16,
            ),
            "16 bytes of binary data follow the JSON header, but the inputs'",
        ),
        (
            _binary_body(
                {"inputs": [_X, _K, {"name": "flag", "shape": [1], "datatype": "BOOL",
                                     "parameters": {"binary_data_size": 1}}]},
                b"\x02",
            ),
            "a BOOL element's byte must be 0 or 1",
        ),
        ((b"{}", {"Inference-Header-Content-Length": "9"}), "Content-Length: expected the"),
        ((b"{}", {"Inference-Header-Content-Length": "x"}), "Content-Length: expected the"),
    ],
)  # fmt: skip
async def test_bad_infer_requests_get_400_with_an_error_string_and_store_nothing(
    api: Api,
    sessions: Sessions,
    broker: redis.Redis,
    oip_models: None,
    request_: tuple[bytes, dict[str, str]],
    says: str,
) -> None:
    body, headers = request_
    response = await api.client.post("/v2/models/mixed/infer", content=body, headers=headers)

    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"}
    assert says in response.json()["error"], response.json()["error"]
    assert_nothing_left(sessions, broker)


async def test_bytes_elements_are_read_by_their_lengths_and_a_cut_one_is_refused(
    api: Api, sessions: Sessions, broker: redis.Redis, oip_models: None
) -> None:
    text = {"name": "text", "shape": [2], "datatype": "BYTES"}
    for data, says in [
        (struct.pack("<I", 3) + b"abc" + struct.pack("<I", 9) + b"xy", "element 1 runs past"),
        (struct.pack("<I", 1) + b"a" + b"\x00\x00", "element 1 has a cut length"),
        (struct.pack("<I", 1) + b"a", "1 BYTES elements, the shape holds 2"),
    ]:
        body, headers = _binary_body(
            {"inputs": [{**text, "parameters": {"binary_data_size": len(data)}}]}, data
        )
        response = await api.client.post("/v2/models/text/infer", content=body, headers=headers)
        assert response.status_code == 400 and says in response.json()["error"], response.text
    assert_nothing_left(sessions, broker)


async def test_an_input_of_too_many_bytes_elements_is_413_before_they_are_read(
    api: Api, sessions: Sessions, oip_models: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oip_binary, "MAX_STRING_ELEMENTS", 3)
    data = struct.pack("<I", 0) * 4
    body, headers = _binary_body(
        {"inputs": [{"name": "text", "shape": [4], "datatype": "BYTES",
                     "parameters": {"binary_data_size": len(data)}}]},
        data,
    )  # fmt: skip
    response = await api.client.post("/v2/models/text/infer", content=body, headers=headers)

    assert response.status_code == 413
    assert "4 BYTES elements; an input holds at most 3" in response.json()["error"]
    assert count_jobs(sessions) == 0


async def test_a_compressed_body_is_refused_by_name_and_a_large_one_is_413(
    open_api: OpenApi, sessions: Sessions, oip_models: None
) -> None:
    async with open_api(max_body_bytes=1024, max_json_items=50) as api:
        body, headers = request_of(sample(1))
        gzipped = await api.client.post(
            "/v2/models/mixed/infer", content=body, headers={**headers, "Content-Encoding": "gzip"}
        )
        large = await api.client.post(
            "/v2/models/mixed/infer", content=b" " * 2048, headers=headers
        )
        items = await api.client.post(
            "/v2/models/mixed/infer", content=b"[" + b"0," * 60 + b"0]", headers={}
        )

    assert gzipped.status_code == 415 and "Content-Encoding" in gzipped.json()["error"]
    assert large.status_code == 413 and set(large.json()) == {"error"}
    assert items.status_code == 413 and "TFFLEET_MAX_JSON_ITEMS" in items.json()["error"]
    assert count_jobs(sessions) == 0


async def test_health_and_server_metadata_answer_without_a_key(api: Api) -> None:
    anonymous = {"Authorization": ""}
    live = await api.client.get("/v2/health/live", headers=anonymous)
    ready = await api.client.get("/v2/health/ready", headers=anonymous)
    server = await api.client.get("/v2", headers=anonymous)

    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert server.status_code == 200
    assert server.json()["name"] == "tffleet"
    assert "binary_tensor_data" in server.json()["extensions"]


async def test_the_server_is_not_ready_while_its_broker_is_unreachable(
    open_api: OpenApi,
) -> None:
    async with open_api(broker_url=DEAD_BROKER_URL) as api:
        response = await api.client.get("/v2/health/ready")

    assert response.status_code == 400
    assert response.json()["ready"] is False and "broker unreachable" in response.json()["error"]


async def test_model_metadata_and_config_are_the_registered_signature(
    api: Api, oip_models: None
) -> None:
    metadata = await api.client.get("/v2/models/mixed")
    by_version = await api.client.get("/v2/models/mixed/versions/1")
    config = await api.client.get("/v2/models/mixed/config")

    assert metadata.status_code == 200, metadata.text
    assert (
        metadata.json()
        == by_version.json()
        == {
            "name": "mixed",
            "versions": ["1"],
            "platform": "tensorflow_savedmodel",
            "inputs": [
                {"name": "flag", "datatype": "BOOL", "shape": [-1]},
                {"name": "k", "datatype": "INT64", "shape": [-1]},
                {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
            ],
            "outputs": [
                {"name": "k2", "datatype": "INT64", "shape": [-1]},
                {"name": "negative", "datatype": "BOOL", "shape": [-1]},
                {"name": "y", "datatype": "FP32", "shape": [-1, 2]},
            ],
        }
    )
    assert config.json()["max_batch_size"] == 8
    assert config.json()["input"][2] == {"name": "x", "data_type": "TYPE_FP32", "dims": [3]}
    text = await api.client.get("/v2/models/text/config")
    assert text.json()["output"] == [{"name": "echo", "data_type": "TYPE_STRING", "dims": []}]


async def test_a_model_is_ready_once_a_live_worker_holds_it(
    api: Api, sessions: Sessions, oip_models: None
) -> None:
    before = await api.client.get("/v2/models/mixed/ready")
    before_version = await api.client.get("/v2/models/mixed/versions/1/ready")
    report(sessions, "cpu:0", ("mixed", 1, PresenceState.LOADED))
    after = await api.client.get("/v2/models/mixed/ready")
    after_version = await api.client.get("/v2/models/mixed/versions/1/ready")
    unknown = await api.client.get("/v2/models/mixed/versions/9/ready")

    assert (before.status_code, before_version.status_code) == (400, 400)
    assert before.json() == {"name": "mixed", "ready": False}
    assert (after.status_code, after_version.status_code) == (200, 200)
    assert unknown.status_code == 404 and "has no version 9" in unknown.json()["error"]


async def test_the_repository_index_lists_each_version_ready_or_not(
    api: Api, sessions: Sessions, oip_models: None
) -> None:
    report(sessions, "cpu:0", ("mixed", 1, PresenceState.LOADED))
    every = await api.client.post("/v2/repository/index")
    ready = await api.client.post("/v2/repository/index", json={"ready": True})
    bad = await api.client.post("/v2/repository/index", json={"ready": "yes"})

    assert every.status_code == 200, every.text
    assert {"name": "mixed", "version": "1", "state": "READY"} in every.json()
    assert {
        "name": "text", "version": "1", "state": "UNAVAILABLE",
        "reason": "no live worker holds it",
    } in every.json()  # fmt: skip
    assert ready.json() == [{"name": "mixed", "version": "1", "state": "READY"}]
    assert bad.status_code == 400 and set(bad.json()) == {"error"}


async def test_unknown_models_and_versions_get_404_in_the_protocols_shape(
    api: Api, sessions: Sessions, broker: redis.Redis
) -> None:
    body, headers = request_of(sample(1))
    for method, path in [
        ("GET", "/v2/models/nope"),
        ("GET", "/v2/models/nope/ready"),
        ("GET", "/v2/models/nope/config"),
        ("GET", "/v2/models/mlp/versions/7"),
        ("POST", "/v2/models/nope/infer"),
        ("POST", "/v2/models/mlp/versions/7/infer"),
    ]:
        response = await api.client.request(method, path, content=body, headers=headers)
        assert response.status_code == 404, (path, response.text)
        assert set(response.json()) == {"error"}
    bad_version = await api.client.get("/v2/models/mlp/versions/x")
    assert (
        bad_version.status_code == 400
        and "version: expected a positive integer" in (bad_version.json()["error"])
    )
    assert_nothing_left(sessions, broker)


async def test_every_model_route_takes_a_key_and_answers_401_in_the_protocols_shape(
    api: Api, sessions: Sessions, broker: redis.Redis, oip_models: None
) -> None:
    body, headers = request_of(sample(1))
    anonymous = {**headers, "Authorization": ""}
    for method, path in [
        ("GET", "/v2/models/mixed"),
        ("GET", "/v2/models/mixed/versions/1"),
        ("GET", "/v2/models/mixed/ready"),
        ("GET", "/v2/models/mixed/versions/1/ready"),
        ("GET", "/v2/models/mixed/config"),
        ("POST", "/v2/models/mixed/infer"),
        ("POST", "/v2/models/mixed/versions/1/infer"),
        ("POST", "/v2/repository/index"),
    ]:
        response = await api.client.request(method, path, content=body, headers=anonymous)
        assert response.status_code == 401, (path, response.text)
        assert set(response.json()) == {"error"}
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert_nothing_left(sessions, broker)


async def test_an_infer_is_a_job_of_the_callers_tenant_seen_by_it_alone(
    open_api: OpenApi, sessions: Sessions, redis_url: str, oip_models: None
) -> None:
    async with open_api() as api:
        acme = api.key("acme")
        body, headers = request_of(sample(1))
        with fake_worker(sessions, redis_url, mixed) as done:
            response = await api.client.post(
                "/v2/models/mixed/infer", content=body, headers={**headers, **acme}
            )
        assert response.status_code == 200, response.text
        (job_id,) = done
        assert read_job(sessions, job_id).tenant == "acme"
        mine = await api.client.get(f"/v1/jobs/{job_id}", headers=acme)
        theirs = await api.client.get(f"/v1/jobs/{job_id}", headers=api.key("other"))
        assert mine.status_code == 200 and theirs.status_code == 404
