"""TF Serving's REST API over the job queue: predict (row and columnar), model status and
metadata, answered in TF Serving's documented shapes (tensorflow.org/tfx/serving/api_rest)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson
import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db import jobs, registry
from db.models import DEFAULT_TENANT, Job, JobErrorCode, PresenceState
from tests.api.conftest import (
    Api,
    OpenApi,
    _until_subscribed,
    assert_nothing_left,
    count_jobs,
    fake_worker,
    read_job,
)
from tests.api.test_models import report
from tffleet import tensors
from tffleet.constants import JOBS_DONE_CHANNEL

pytestmark = pytest.mark.anyio

Sessions = sessionmaker[Session]
Outputs = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

# Models of TF Serving's examples: half_plus_three (its REST example), one with two outputs, and
# one with a string input and a binary string output (`_bytes`).
EXTRA = {
    "half_plus_three": (
        {"x": {"dtype": "float32", "shape": [-1]}},
        {"y": {"dtype": "float32", "shape": [-1]}},
    ),
    "two": (
        {"x": {"dtype": "float32", "shape": [-1, 4]}},
        {
            "scores": {"dtype": "float32", "shape": [-1, 2]},
            "label": {"dtype": "int64", "shape": [-1]},
        },
    ),
    "text": (
        {"text": {"dtype": "string", "shape": [-1]}},
        {"echo_bytes": {"dtype": "string", "shape": [-1]}},
    ),
}


@pytest.fixture
def extra_models(sessions: Sessions, models: dict[str, Any]) -> None:
    with sessions.begin() as session:
        for name, (inputs, outputs) in EXTRA.items():
            registry.register(
                session=session, name=name, version=1, format="savedmodel", inputs=inputs,
                outputs=outputs,
            )  # fmt: skip


def half_plus_three(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": (inputs["x"] / 2 + 3).astype(np.float32)}


async def test_tf_servings_rest_example_predicts_half_plus_three(
    api: Api, sessions: Sessions, redis_url: str, extra_models: None
) -> None:
    # The documentation's example: curl -d '{"instances": [1.0,2.0,5.0]}' ...:predict
    with fake_worker(sessions, redis_url, half_plus_three) as done:
        response = await api.client.post(
            "/v1/models/half_plus_three:predict", json={"instances": [1.0, 2.0, 5.0]}
        )

    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": [3.5, 4.0, 5.5]}
    (job_id,) = done
    job = read_job(sessions, job_id)
    assert job.tenant == DEFAULT_TENANT and job.priority == 0 and job.status == "succeeded"


async def test_predict_without_a_content_type_as_curl_d_sends_it(
    api: Api, sessions: Sessions, redis_url: str, extra_models: None
) -> None:
    with fake_worker(sessions, redis_url, half_plus_three):
        response = await api.client.post(
            "/v1/models/half_plus_three/versions/1:predict",
            content=b'{"inputs": [1.0, 5.0]}',
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )

    assert response.status_code == 200, response.text
    assert response.json() == {"outputs": [3.5, 5.5]}


def mlp_outputs(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = inputs["x"]
    return {"y": np.stack([x.sum(axis=1), x.max(axis=1)], axis=1).astype(np.float32)}


async def test_row_format_of_a_one_input_model_answers_a_list_of_per_instance_values(
    api: Api, sessions: Sessions, redis_url: str
) -> None:
    with fake_worker(sessions, redis_url, mlp_outputs):
        bare = await api.client.post(
            "/v1/models/mlp/versions/1:predict",
            json={"signature_name": "serving_default", "instances": [[1, 2, 3, 4], [5, 6, 7, 9]]},
        )
        named = await api.client.post(
            "/v1/models/mlp/versions/1:predict",
            json={"instances": [{"x": [1, 2, 3, 4]}, {"x": [5, 6, 7, 9]}]},
        )

    assert bare.status_code == 200, bare.text
    assert bare.json() == {"predictions": [[10.0, 4.0], [27.0, 9.0]]}
    assert named.json() == bare.json()


async def test_row_format_of_a_two_input_model_takes_objects_by_input_name(
    api: Api, sessions: Sessions, redis_url: str
) -> None:
    def total(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"sum": (inputs["a"].sum(axis=1) + inputs["b"].sum(axis=1)).astype(np.float32)}

    with fake_worker(sessions, redis_url, total) as done:
        rows = await api.client.post(
            "/v1/models/pair:predict",
            json={"instances": [{"a": [1, 2, 3], "b": [4, 5]}, {"a": [0, 0, 1], "b": [0, 1]}]},
        )
        columns = await api.client.post(
            "/v1/models/pair:predict",
            json={"inputs": {"a": [[1, 2, 3], [0, 0, 1]], "b": [[4, 5], [0, 1]]}},
        )

    assert rows.json() == {"predictions": [15.0, 2.0]}
    assert columns.json() == {"outputs": [15.0, 2.0]}  # one output: the value itself
    stored = tensors.unpack(read_job(sessions, done[0]).inputs)
    assert stored["a"].tolist() == [[1, 2, 3], [0, 0, 1]] and stored["b"].tolist() == [
        [4, 5],
        [0, 1],
    ]


def two_outputs(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = inputs["x"]
    scores = np.stack([x[:, 0], x[:, 1]], axis=1).astype(np.float32)
    return {"scores": scores, "label": scores.argmax(axis=1).astype(np.int64)}


async def test_several_outputs_are_objects_per_instance_in_rows_and_one_object_in_columns(
    api: Api, sessions: Sessions, redis_url: str, extra_models: None
) -> None:
    with fake_worker(sessions, redis_url, two_outputs):
        rows = await api.client.post(
            "/v1/models/two:predict", json={"instances": [[1, 2, 0, 0], [3, 1, 0, 0]]}
        )
        columns = await api.client.post(
            "/v1/models/two:predict", json={"inputs": {"x": [[1, 2, 0, 0], [3, 1, 0, 0]]}}
        )

    assert rows.json() == {
        "predictions": [{"label": 1, "scores": [1.0, 2.0]}, {"label": 0, "scores": [3.0, 1.0]}]
    }
    assert columns.json() == {"outputs": {"label": [1, 0], "scores": [[1.0, 2.0], [3.0, 1.0]]}}


async def test_binary_strings_go_as_b64_and_a_bytes_output_comes_back_as_b64(
    api: Api, sessions: Sessions, redis_url: str, extra_models: None
) -> None:
    def echo(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"echo_bytes": inputs["text"]}

    image = b"\x89PNG\xff\x00"
    b64 = base64.b64encode(image).decode()
    with fake_worker(sessions, redis_url, echo) as done:
        response = await api.client.post(
            "/v1/models/text:predict", json={"instances": [{"b64": b64}, "seaside"]}
        )

    assert response.status_code == 200, response.text
    assert tensors.unpack(read_job(sessions, done[0]).inputs)["text"].tolist() == [
        image,
        b"seaside",
    ]
    assert response.json() == {
        "predictions": [{"b64": b64}, {"b64": base64.b64encode(b"seaside").decode()}]
    }


async def test_model_status_lists_each_version_as_tf_serving_does(
    api: Api, sessions: Sessions
) -> None:
    report(sessions, "cpu:0", ("mlp", 2, PresenceState.LOADED))
    with sessions.begin() as session:
        registry.retire(session=session, name="mlp", version=1)

    every = await api.client.get("/v1/models/mlp")
    one = await api.client.get("/v1/models/mlp/versions/2")

    ok = {"error_code": "OK", "error_message": ""}
    assert every.status_code == 200, every.text
    assert every.json() == {
        "model_version_status": [
            {"version": "1", "state": "END", "status": ok},
            {"version": "2", "state": "AVAILABLE", "status": ok},
        ]
    }
    assert one.json() == {
        "model_version_status": [{"version": "2", "state": "AVAILABLE", "status": ok}]
    }
    unserved = await api.client.get("/v1/models/pair")
    assert unserved.json()["model_version_status"][0]["state"] == "START"
    # tffleet's own listing is where it was.
    assert {m["name"] for m in (await api.client.get("/v1/models")).json()["models"]} >= {"mlp"}


async def test_model_metadata_is_the_registered_signature_as_a_signature_def(api: Api) -> None:
    response = await api.client.get("/v1/models/pair/metadata")
    versioned = await api.client.get("/v1/models/mlp/versions/1/metadata")

    assert response.status_code == 200, response.text
    assert response.json() == {
        "model_spec": {"name": "pair", "signature_name": "", "version": "1"},
        "metadata": {
            "signature_def": {
                "signature_def": {
                    "serving_default": {
                        "inputs": {
                            "a": _info("a", "DT_FLOAT", [-1, 3]),
                            "b": _info("b", "DT_FLOAT", [-1, 2]),
                        },
                        "outputs": {"sum": _info("sum", "DT_FLOAT", [-1])},
                        "method_name": "tensorflow/serving/predict",
                    }
                }
            }
        },
    }
    signature = versioned.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert versioned.json()["model_spec"]["version"] == "1"
    assert signature["outputs"]["y"] == _info("y", "DT_FLOAT", [-1, 2])


def _info(name: str, dtype: str, shape: list[int]) -> dict[str, Any]:
    dims = [{"size": str(d), "name": ""} for d in shape]
    return {"dtype": dtype, "tensor_shape": {"dim": dims, "unknown_rank": False}, "name": name}


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/models/nope:predict", 404),
        ("/v1/models/mlp/versions/9:predict", 404),
        ("/v1/models/mlp/versions/one:predict", 400),
    ],
    ids=["model", "version", "bad-version"],
)
async def test_unknown_models_and_versions_get_an_error_string_and_store_nothing(
    api: Api, sessions: Sessions, broker: redis.Redis, path: str, status: int
) -> None:
    response = await api.client.post(path, json={"instances": [[1, 2, 3, 4]]})

    assert response.status_code == status
    assert isinstance(response.json()["error"], str) and set(response.json()) == {"error"}
    assert_nothing_left(sessions, broker)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"instances": [[1, 2, 3, 4]], "inputs": [[1, 2, 3, 4]]}', "either"),
        (b'{"signature_name": "serving_default"}', "either"),
        (b'{"instances": []}', "non-empty"),
        (b'{"instances": [[1, 2, 3]]}', "dimension 1 must be 4"),
        (b'{"instances": [[1, 2, 3, 4], {"x": [1, 2, 3, 4]}]}', "every instance"),
        (b'{"instances": [{"y": [1, 2, 3, 4]}]}', "missing ['x']"),
        (b'{"inputs": {"x": [["a", "b", "c", "d"]]}}', "inputs.x"),
        (b'{"signature_name": "classify", "instances": [[1, 2, 3, 4]]}', "signature_name"),
        (b'{"instances": [[1, 2, 3, 4]], "examples": []}', "unknown keys"),
    ],
    ids=[
        "json", "array", "both", "neither", "empty", "shape", "mixed", "name", "dtype",
        "signature", "key",
    ],
)  # fmt: skip
async def test_bad_predict_bodies_get_400_with_an_error_string_and_store_nothing(
    api: Api, sessions: Sessions, broker: redis.Redis, body: bytes, says: str
) -> None:
    response = await api.client.post(
        "/v1/models/mlp:predict", content=body, headers={"Content-Type": "application/json"}
    )

    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"} and says in response.json()["error"]
    assert_nothing_left(sessions, broker)


async def test_a_pair_model_refuses_bare_instances(api: Api, sessions: Sessions) -> None:
    response = await api.client.post("/v1/models/pair:predict", json={"instances": [[1, 2, 3]]})

    assert response.status_code == 400
    assert "object of its inputs by name" in response.json()["error"]
    assert count_jobs(sessions) == 0


async def test_every_route_takes_a_key_and_answers_401_in_tf_servings_shape(
    api: Api, sessions: Sessions, broker: redis.Redis
) -> None:
    anonymous = {"Authorization": ""}
    for method, path in [
        ("POST", "/v1/models/mlp:predict"),
        ("POST", "/v1/models/mlp/versions/1:predict"),
        ("GET", "/v1/models/mlp"),
        ("GET", "/v1/models/mlp/versions/1"),
        ("GET", "/v1/models/mlp/metadata"),
        ("GET", "/v1/models/mlp/versions/1/metadata"),
    ]:
        response = await api.client.request(
            method, path, headers=anonymous, json={"instances": [[1, 2, 3, 4]]}
        )
        assert response.status_code == 401, (path, response.text)
        assert set(response.json()) == {"error"}
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert_nothing_left(sessions, broker)


async def test_past_the_wait_the_answer_is_504_naming_a_job_of_the_callers_tenant(
    open_api: OpenApi, sessions: Sessions
) -> None:
    async with open_api(protocol_wait_s=0.3) as api:
        acme = api.key("acme")
        started = time.monotonic()
        response = await api.client.post(
            "/v1/models/mlp:predict", json={"instances": [[1, 2, 3, 4]]}, headers=acme
        )
        # It waited out protocol_wait_s, and did not hang (a bound loose enough for a loaded host).
        assert 0.25 <= time.monotonic() - started < 30

        assert response.status_code == 504
        (job_id,) = [j.id for j in _jobs(sessions)]
        assert job_id in response.json()["error"]
        polled = await api.client.get(f"/v1/jobs/{job_id}", headers=acme)
        assert polled.status_code == 200 and polled.json()["status"] == "queued"
        other = await api.client.get(f"/v1/jobs/{job_id}", headers=api.key("other"))
        assert other.status_code == 404
        assert read_job(sessions, job_id).tenant == "acme"


def _jobs(sessions: Sessions) -> list[Job]:
    with sessions() as session:
        return list(session.scalars(select(Job)))


async def test_a_job_that_fails_answers_its_error_in_tf_servings_shape(
    open_api: OpenApi, sessions: Sessions, redis_url: str
) -> None:
    def fail_first() -> None:
        _until_subscribed(redis_url)
        while True:
            found = _jobs(sessions)
            if found:
                break
            time.sleep(0.01)
        with sessions.begin() as session:
            leases = jobs.claim(session=session, job_ids=[found[0].id], owner="w", lease_s=60)
        with sessions.begin() as session:
            jobs.fail(session=session, leases=leases, code=JobErrorCode.MODEL_ERROR, message="boom")
        with redis.Redis.from_url(redis_url) as client:
            client.publish(JOBS_DONE_CHANNEL, orjson.dumps([found[0].id]))

    async with open_api(protocol_wait_s=5) as api:
        thread = threading.Thread(target=fail_first, daemon=True)
        thread.start()
        response = await api.client.post(
            "/v1/models/mlp:predict", json={"instances": [[1, 2, 3, 4]]}
        )
        thread.join(10)

    assert response.status_code == 500
    (job,) = _jobs(sessions)
    assert response.json() == {"error": f"job {job.id} failed (model_error): boom"}
