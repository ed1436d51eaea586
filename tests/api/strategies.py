"""Hypothesis strategies for requests the API must refuse, and for valid ones: malformed
tensors and bodies, wrong content types and keys. Shared by the API's fuzz tests and the run of
10,000 bad requests against a loaded fleet (tests/e2e/test_bad_requests.py)."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError

from api.schemas import JobBatchCreate, JobCreate
from api.validation import validate_inputs
from tests.api.conftest import MAX_BODY_BYTES, SIGNATURES
from tffleet.errors import InvalidInput

FLOAT32_MAX = float(np.finfo(np.float32).max)


def as_json(value: Any) -> bytes:
    # Not orjson: it refuses integers past 64 bits, which a client may well send.
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


def b64(raw: bytes) -> str:
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
    envelope: dict[str, Any] = {"b64": b64(good.tobytes()), "dtype": dtype, "shape": [rows, width]}
    if kind == "non_finite":
        model, dtype = "mlp", "float32"
        values = draw(st.lists(st.floats(width=32), min_size=4, max_size=4 * rows)).copy()
        values[draw(st.integers(0, len(values) - 1))] = draw(
            st.sampled_from([math.nan, math.inf, -math.inf])
        )
        values += [0.0] * (-len(values) % 4)
        array = np.asarray(values, dtype="<f4").reshape(-1, 4)
        envelope = {"b64": b64(array.tobytes()), "dtype": "float32", "shape": list(array.shape)}
    elif kind == "huge":
        envelope["shape"] = draw(
            st.sampled_from(
                [[2**40, width], [2**62, 2**62], [1, 2**63], [0, 2**70], [2**31, 2**31, 2**31]]
            )
        )
    elif kind == "mismatch":
        size = rows * width * 4
        envelope["b64"] = b64(draw(st.binary(max_size=64).filter(lambda b: len(b) != size)))
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
        return as_json(job)
    valid = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
    return as_json({"jobs": [valid, job] if draw(st.booleans()) else [job]})


@st.composite
def malformed_bodies(draw: st.DrawFn) -> bytes:
    """Bodies that are not a job: truncated or broken JSON, bytes, other shapes of JSON."""
    kind = draw(
        st.sampled_from(
            ["truncated", "bytes", "not_utf8", "deep", "nan", "value", "fields", "too_big"]
        )
    )
    valid = as_json({"model": "mlp", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}})
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
        return as_json(draw(json_values.filter(lambda v: not isinstance(v, dict) or "jobs" in v)))
    if kind == "fields":
        job: dict[str, Any] = {"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]}
        field = draw(st.sampled_from(["model", "version", "priority", "inputs", "extra", "jobs"]))
        job[field] = draw(json_values)
        if field == "jobs":
            job = {"jobs": job["jobs"]}
        # A random value may happen to fit (version 1, "count", priority "7"): not this strategy's.
        return as_json(draw(st.just(job).filter(_does_not_fit)))
    # Over TFFLEET_MAX_BODY_BYTES.
    return as_json({"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]] * (MAX_BODY_BYTES // 8)})


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


not_api_keys = st.one_of(
    st.sampled_from(["", "Bearer", "Basic dXNlcjpwYXNz", "bearer tff_x", "Token abc"]),
    st.builds(  # well formed, but no such key (or no such secret)
        lambda prefix, secret: f"Bearer tff_{prefix}_{secret}",
        st.text("0123456789abcdef", min_size=12, max_size=12),
        st.text("ABCDEFabcdef0123456789-_", min_size=43, max_size=43),
    ),
    # Anything an HTTP client can send as a header value.
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=80).map(
        lambda text: f"Bearer {text}"
    ),
)

content_types = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "application/vnd.api+json"]
)
wrong_content_types = st.sampled_from(
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "", "json"]
)


@st.composite
def bad_requests(draw: st.DrawFn) -> tuple[bytes, str, dict[str, str]]:
    body = draw(st.one_of(invalid_jobs(), malformed_bodies()))
    valid = as_json({"model": "mlp", "inputs": [[1.0, 2.0, 3.0, 4.0]]})
    roll = draw(st.integers(min_value=0, max_value=19))
    if roll == 0:
        return draw(st.sampled_from([body, valid])), draw(wrong_content_types), {}
    if roll == 1:  # a valid job under a key that is not one
        key = draw(st.sampled_from(["a b", "x" * 129, "tab\there", "a,b c"]))
        return valid, "application/json", {"Idempotency-Key": key}
    if roll == 2:  # a valid job without a valid API key
        return valid, "application/json", {"Authorization": draw(not_api_keys)}
    return body, draw(content_types), {}


def _finite_float32() -> st.SearchStrategy[float]:
    return st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def valid_jobs(draw: st.DrawFn) -> tuple[bytes, int]:
    rows = draw(st.integers(min_value=1, max_value=8))
    array = draw(hnp.arrays(np.float32, (rows, 4), elements=_finite_float32()))
    wire = draw(st.sampled_from(["lists", "bare", "envelope"]))
    if wire == "envelope":
        tensor: Any = {"b64": b64(array.astype("<f4").tobytes()), "dtype": "float32"}
        tensor["shape"] = [rows, 4]
        inputs: Any = {"x": tensor}
    elif wire == "bare":
        inputs = array.tolist()
    else:
        inputs = {"x": array.tolist()}
    return as_json({"model": "mlp", "inputs": inputs}), rows
