"""Bad input, tried wide: schemathesis on the app's own OpenAPI schema, and hypothesis on the
bodies of `POST /v1/jobs`.

Property tests run many requests from synchronous code, so the API here is a real `tffleet api`
process (on SQLite: the request path is the same on either database) driven over HTTP, not the
in-process app: that needs an event loop per call. The fake fleet's signatures are registered
(`models`) before it starts; no worker runs, so a job accepted stays `queued`.
"""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.schemas import JobBatchCreate, JobCreate
from api.validation import validate_inputs
from db import tenants
from db.models import DEFAULT_TENANT
from tests.api.conftest import (
    MAX_BODY_BYTES,
    SIGNATURES,
    Sessions,
    assert_nothing_left,
    count_jobs,
)
from tffleet.cli.process_group import free_port
from tffleet.errors import InvalidInput

pytestmark = pytest.mark.slow

# What an invalid submission may be answered with (DESIGN.md section 3): never 202, never 5xx.
REJECTED = {400, 413, 415, 422}

# Bounded so that the file runs in well under two minutes.
EXAMPLES_PER_OPERATION = 50
INVALID_BODIES = 600
VALID_BODIES = 40


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: the API's code path is the same on PostgreSQL, and this is much faster."""
    return sqlite_url


@dataclass
class ApiProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    headers: dict[str, str]  # an admin key's

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, (
            f"the API exited ({self.proc.returncode}):\n{self.output()}"
        )
        response = httpx.get(f"{self.url}/healthz", timeout=10)
        assert response.status_code == 200, response.text
        assert response.json() == {"status": "ok"}


@pytest.fixture
def api_process(
    db_url: str, redis_url: str, models: dict[str, Any], sessions: Sessions, tmp_path: Path
) -> Iterator[ApiProcess]:
    port = free_port()
    log = tmp_path / "api.log"
    env = {
        **os.environ,
        "TFFLEET_DATABASE_URL": db_url,
        "TFFLEET_BROKER_URL": redis_url,
        "TFFLEET_API_PORT": str(port),
        "TFFLEET_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tffleet.cli", "api", "--log-level", "WARNING"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    with sessions.begin() as session:
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
    headers = {"Authorization": f"Bearer {key}"}
    running = ApiProcess(url=f"http://127.0.0.1:{port}", proc=proc, log=log, headers=headers)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the API exited ({proc.returncode}):\n{running.output()}"
            try:
                if httpx.get(f"{running.url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the API never got ready:\n{running.output()}"
            time.sleep(0.1)
        yield running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def http(api_process: ApiProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_process.url, timeout=30, headers=api_process.headers) as client:
        yield client


# 1. schemathesis: every operation of the app's own schema


def test_every_operation_answers_within_its_schema(
    api_process: ApiProcess, sessions: Sessions
) -> None:
    schema = schemathesis.openapi.from_url(f"{api_process.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {operation.label for operation in operations}
    assert {"POST /v1/jobs", "GET /v1/jobs/{job_id}", "POST /v1/jobs/status"} <= labels

    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            _fuzz_operation(operation, mode, api_process.url, api_process.headers)
    api_process.assert_alive()
    # No worker runs: whatever was accepted is still there, and never more than was sent.
    assert count_jobs(sessions) <= 2 * EXAMPLES_PER_OPERATION


def _fuzz_operation(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    url: str,
    headers: dict[str, str],
) -> None:
    checks = [not_a_server_error, status_code_conformance, content_type_conformance]
    if mode is schemathesis.GenerationMode.POSITIVE:
        checks.append(response_schema_conformance)

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        if isinstance(case.query, dict) and "wait" in case.query:
            case.query["wait"] = 0  # a long-poll on a job that exists would hold 30 s
        response = case.call(base_url=url, timeout=30, headers=headers)
        case.validate_response(response, checks=checks)

    try:
        run()
    except Unsatisfiable:
        # Nothing to get wrong: every string is a valid `job_id`, and some operations take nothing.
        if mode is not schemathesis.GenerationMode.NEGATIVE:
            raise


# 2. hypothesis: malformed tensors and bodies for POST /v1/jobs

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _json(value: Any) -> bytes:
    # Not orjson: it refuses integers past 64 bits, which a client may well send.
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
not_a_number = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.dictionaries(st.text(max_size=3), json_scalars, max_size=2),
    st.lists(json_scalars, max_size=2),
)


@st.composite
def wrong_rank(draw: st.DrawFn) -> tuple[str, Any]:
    """Finite numbers, but of a rank the model does not take (or an empty batch)."""
    model = draw(st.sampled_from(["mlp", "count"]))
    rank = draw(st.sampled_from([0, 1, 3, 4]) if model == "mlp" else st.sampled_from([0, 1, 3]))
    shape = draw(hnp.array_shapes(min_dims=rank, max_dims=rank, min_side=1, max_side=3))
    dtype = np.float32 if model == "mlp" else np.int32
    array = np.ones(shape, dtype=dtype)
    return model, array.tolist() if rank else array.item()


@st.composite
def wrong_width(draw: st.DrawFn) -> tuple[str, Any]:
    rows = draw(st.integers(min_value=1, max_value=3))
    width = draw(st.integers(min_value=0, max_value=8).filter(lambda w: w != 4))
    return "mlp", [[0.5] * width for _ in range(rows)]


@st.composite
def wrong_dtype(draw: st.DrawFn) -> tuple[str, Any]:
    """Every element of a well-shaped batch is something other than a number."""
    model = draw(st.sampled_from(["mlp", "count"]))
    rows = draw(st.integers(min_value=1, max_value=3))
    width = 4 if model == "mlp" else draw(st.integers(min_value=1, max_value=4))
    element = draw(not_a_number)
    if model == "count" and draw(st.booleans()):
        element = draw(
            st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
        )
    return model, [[element] * width for _ in range(rows)]


@st.composite
def ragged(draw: st.DrawFn) -> tuple[str, Any]:
    model = draw(st.sampled_from(["mlp", "count"]))
    first = draw(st.integers(min_value=1, max_value=4))
    second = draw(st.integers(min_value=0, max_value=4).filter(lambda n: n != first))
    return model, [[1] * first, [1] * second]


@st.composite
def out_of_range(draw: st.DrawFn) -> tuple[str, Any]:
    """Numbers JSON can carry but the dtype cannot hold."""
    if draw(st.booleans()):
        big = draw(st.floats(min_value=FLOAT32_MAX * 1.01, max_value=1e308))
        sign = draw(st.sampled_from([1, -1]))
        return "mlp", [[1.0, 2.0, 3.0, sign * big]]
    value = draw(
        st.integers(min_value=2**31, max_value=2**80) | st.integers(max_value=-(2**31) - 1)
    )
    return "count", [[1, value]]


@st.composite
def bad_envelope(draw: st.DrawFn) -> tuple[str, Any]:
    """Binary envelopes that lie: NaN/inf, shapes past any memory, wrong byte counts..."""
    kind = draw(
        st.sampled_from(
            ["non_finite", "huge", "mismatch", "bad_shape", "bad_dtype", "bad_b64", "keys", "empty"]
        )
    )
    model, dtype, width = draw(st.sampled_from([("mlp", "float32", 4), ("count", "int32", 3)]))
    rows = draw(st.integers(min_value=1, max_value=3))
    good = np.zeros((rows, width), dtype=dtype)
    envelope: dict[str, Any] = {"b64": _b64(good.tobytes()), "dtype": dtype, "shape": [rows, width]}
    if kind == "non_finite":
        model, dtype = "mlp", "float32"
        values = draw(st.lists(st.floats(width=32), min_size=4, max_size=4 * rows)).copy()
        values[draw(st.integers(0, len(values) - 1))] = draw(
            st.sampled_from([math.nan, math.inf, -math.inf])
        )
        values += [0.0] * (-len(values) % 4)
        array = np.asarray(values, dtype="<f4").reshape(-1, 4)
        envelope = {"b64": _b64(array.tobytes()), "dtype": "float32", "shape": list(array.shape)}
    elif kind == "huge":
        envelope["shape"] = draw(
            st.sampled_from(
                [[2**40, width], [2**62, 2**62], [1, 2**63], [0, 2**70], [2**31, 2**31, 2**31]]
            )
        )
    elif kind == "mismatch":
        size = rows * width * 4
        envelope["b64"] = _b64(draw(st.binary(max_size=64).filter(lambda b: len(b) != size)))
    elif kind == "bad_shape":
        envelope["shape"] = draw(
            st.sampled_from([[-1, width], [rows * 1.0, width], str(rows), None, {}, [True, 4]])
            | st.just([1] * 70)
        )
    elif kind == "bad_dtype":
        envelope["dtype"] = draw(
            st.sampled_from(["float64", "int64", "bool", "string", "", None, 4, ["float32"]])
        )
    elif kind == "bad_b64":
        envelope["b64"] = draw(st.sampled_from(["not base64!", "AAA", 12, None, ["AAAA"], "A" * 5]))
    elif kind == "keys":
        extra = draw(st.sampled_from(["extra", "B64", "data"]))
        envelope = {k: v for k, v in envelope.items() if k != draw(st.sampled_from(list(envelope)))}
        envelope[extra] = "x"
    else:  # an empty batch
        envelope = {"b64": "", "dtype": dtype, "shape": [0, width]}
    return model, envelope


@st.composite
def deep(draw: st.DrawFn) -> tuple[str, Any]:
    depth = draw(st.sampled_from([33, 65, 100, 500]))
    return draw(st.sampled_from(["mlp", "count"])), _nested(depth, 1)


invalid_tensors = st.one_of(
    wrong_rank(),
    wrong_width(),
    wrong_dtype(),
    ragged(),
    out_of_range(),
    bad_envelope(),
    deep(),
    st.tuples(st.sampled_from(["mlp", "count"]), st.just([])),  # an empty batch
)


@st.composite
def invalid_jobs(draw: st.DrawFn) -> bytes:
    """Well-formed JSON whose tensor (bare, by name, or in a bulk request) does not fit."""
    model, tensor = draw(invalid_tensors)
    name = "x" if model == "mlp" else "ids"
    inputs = draw(st.sampled_from(["bare", "named"]))
    if isinstance(tensor, dict) and set(tensor) == {"b64", "dtype", "shape"} and inputs == "bare":
        inputs = "named"
    job = {"model": model, "inputs": tensor if inputs == "bare" else {name: tensor}}
    if draw(st.booleans()):
        return _json(job)
    valid = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
    return _json({"jobs": [valid, job] if draw(st.booleans()) else [job]})


@st.composite
def malformed_bodies(draw: st.DrawFn) -> bytes:
    """Bodies that are not a job: truncated or broken JSON, bytes, other shapes of JSON."""
    kind = draw(
        st.sampled_from(
            ["truncated", "bytes", "not_utf8", "deep", "nan", "value", "fields", "too_big"]
        )
    )
    valid = _json({"model": "mlp", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}})
    if kind == "truncated":
        return valid[: draw(st.integers(min_value=0, max_value=len(valid) - 1))]
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "not_utf8":
        return b'{"model": "mlp", "inputs": {"x": [[1, 2, 3, 4]]}, "\xff\xfe": 1}'
    if kind == "deep":  # past the JSON parser's nesting limit
        depth = draw(st.sampled_from([1100, 2000, 5000]))
        return b'{"model": "mlp", "inputs": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
    if kind == "nan":
        literal = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999"]))
        return b'{"model": "mlp", "inputs": [[1, 2, 3, ' + literal + b"]]}"
    if kind == "value":  # JSON, but not an object with a job in it
        return _json(draw(json_values.filter(lambda v: not isinstance(v, dict) or "jobs" in v)))
    if kind == "fields":
        job: dict[str, Any] = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
        field = draw(st.sampled_from(["model", "version", "priority", "inputs", "extra", "jobs"]))
        job[field] = draw(json_values)
        if field == "jobs":
            job = {"jobs": job["jobs"]}
        # A random value may happen to fit (version 1, "count", priority "7"): not this strategy's.
        return _json(draw(st.just(job).filter(_does_not_fit)))
    # Over TFFLEET_MAX_BODY_BYTES.
    return _json({"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]] * (MAX_BODY_BYTES // 8)})


def _does_not_fit(body: Any) -> bool:
    """Whether the API must refuse this body: a field fails its schema, or the inputs their
    model's signature; an unknown model or version (404) does not count as either."""
    try:
        jobs = JobBatchCreate.model_validate(body).jobs if "jobs" in body else None
        specs = jobs or [JobCreate.model_validate(body)]
    except ValidationError:
        return True
    for spec in specs:
        versions = SIGNATURES.get(spec.model, {})
        version = spec.version or max(versions, default=0)
        if version not in versions:
            return False  # 404
        try:
            validate_inputs(spec.inputs, signature=versions[version][0], model=spec.model)
        except InvalidInput:
            return True
    return False


content_types = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "application/vnd.api+json"]
)
wrong_content_types = st.sampled_from(
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "", "json"]
)


@st.composite
def bad_requests(draw: st.DrawFn) -> tuple[bytes, str, dict[str, str]]:
    body = draw(st.one_of(invalid_jobs(), malformed_bodies()))
    valid = _json({"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]})
    roll = draw(st.integers(min_value=0, max_value=19))
    if roll == 0:
        return draw(st.sampled_from([body, valid])), draw(wrong_content_types), {}
    if roll == 1:  # a valid job under a key that is not one
        key = draw(st.sampled_from(["a b", "x" * 129, "tab\there", "a,b c"]))
        return valid, "application/json", {"Idempotency-Key": key}
    return body, draw(content_types), {}


def _post(
    http: httpx.Client, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    sent = {"Content-Type": content_type} if content_type else {}
    return http.post("/v1/jobs", content=body, headers={**sent, **(headers or {})})


def test_invalid_submissions_are_refused_and_leave_nothing(
    api_process: ApiProcess, http: httpx.Client, sessions: Sessions, broker: redis.Redis
) -> None:
    seen: set[int] = set()

    @settings(
        max_examples=INVALID_BODIES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=bad_requests())
    def run(request: tuple[bytes, str, dict[str, str]]) -> None:
        body, content_type, headers = request
        response = _post(http, body, content_type, headers)
        assert response.status_code in REJECTED, (response.status_code, response.text, body[:300])
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["code"] and error["message"]
        seen.add(response.status_code)

    run()
    assert seen == REJECTED  # every kind of refusal was exercised
    assert_nothing_left(sessions, broker)
    api_process.assert_alive()


def _finite_float32() -> st.SearchStrategy[float]:
    return st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def valid_jobs(draw: st.DrawFn) -> tuple[bytes, int]:
    rows = draw(st.integers(min_value=1, max_value=8))
    array = draw(hnp.arrays(np.float32, (rows, 4), elements=_finite_float32()))
    wire = draw(st.sampled_from(["lists", "bare", "envelope"]))
    if wire == "envelope":
        tensor: Any = {"b64": _b64(array.astype("<f4").tobytes()), "dtype": "float32"}
        tensor["shape"] = [rows, 4]
        inputs: Any = {"x": tensor}
    elif wire == "bare":
        inputs = array.tolist()
    else:
        inputs = {"x": array.tolist()}
    return _json({"model": "mlp", "inputs": inputs}), rows


def test_valid_random_inputs_are_accepted(
    api_process: ApiProcess, http: httpx.Client, sessions: Sessions
) -> None:
    accepted: list[str] = []

    @settings(
        max_examples=VALID_BODIES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(job=valid_jobs())
    def run(job: tuple[bytes, int]) -> None:
        body, _rows = job
        response = _post(http, body, "application/json")
        assert response.status_code == 202, (response.text, body[:300])
        out = response.json()
        assert out["model"] == "mlp"
        assert out["status"] == "queued"
        accepted.append(out["id"])

    run()
    assert len(set(accepted)) == len(accepted)
    assert count_jobs(sessions) == len(accepted)
    api_process.assert_alive()
