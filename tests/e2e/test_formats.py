"""End to end: one worker serving every format at once, string and bool tensors over HTTP and
through the Python client, and a corrupt model that fails alone. On the fleet the read-only
modules share (tests/e2e/conftest.py)."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import SharedFleet
from tests.formats import VOCABULARY
from tffleet import Client

pytestmark = pytest.mark.slow

FINISHED = ("succeeded", "failed", "canceled")


def wait_for(client: httpx.Client, job_ids: list[str], **params: Any) -> list[dict[str, Any]]:
    done = []
    for job_id in job_ids:
        for _ in range(10):
            job = client.get(f"/v1/jobs/{job_id}", params={"wait": 30, **params}).json()
            if job["status"] in FINISHED:
                break
        assert job["status"] == "succeeded", job
        done.append(job)
    return done


def test_one_worker_serves_every_format_and_a_corrupt_model_fails_alone(
    shared_fleet: SharedFleet,
) -> None:
    fleet, built = shared_fleet.fleet, shared_fleet.built
    mixed, text, kfile, frozen = built["mixed"], built["text"], built["kfile"], built["frozen"]
    broken = built["broken"]

    log = fleet.log("worker")
    assert f"{broken}: not a loadable SavedModel (OSError: Cannot parse file" in log, log[-3000:]

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 3)).astype(np.float32)
    k = np.array([1, -2, 2**40], dtype=np.int64)
    flag = np.array([True, False, True])
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = np.array([[1, 2], [3, -4]], dtype=np.int32)
    image = rng.standard_normal((2, 4)).astype(np.float32)
    with fleet.http(timeout=60) as client:
        listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert "broken" not in listed
        assert {name: listed[name]["format"] for name in ("mixed", "text", "kfile", "frozen")} == {
            "mixed": "saved_model",
            "text": "saved_model",
            "kfile": "keras",
            "frozen": "frozen_graph",
        }
        assert listed["text"]["inputs"] == {"text": {"dtype": "string", "shape": [-1]}}
        missing = client.post("/v1/jobs", json={"model": "broken", "inputs": [[1.0]]})
        assert missing.status_code == 404, missing.text

        # One request, so the two text jobs share a batch padded with empty strings.
        submitted = client.post(
            "/v1/jobs",
            json={
                "jobs": [
                    {
                        "model": "mixed",
                        "inputs": {"x": x.tolist(), "k": k.tolist(), "flag": flag.tolist()},
                    },
                    {"model": "text", "inputs": ["one", "été"]},
                    {"model": "text", "inputs": [{"b64": base64.b64encode(b"\xff").decode()}]},
                    {"model": "kfile", "inputs": {"a": a.tolist(), "b": b.tolist()}},
                    {"model": "frozen", "inputs": {"image": image.tolist(), "words": ["é", ""]}},
                ]
            },
        )
        assert submitted.status_code == 202, submitted.text
        ids = [job["id"] for job in submitted.json()["jobs"]]
        mixed_job, text_job, bytes_job, keras_job, frozen_job = wait_for(client, ids)
        (text_b64,) = wait_for(client, ids[1:2], encoding="b64")

    expected = mixed.predict(x=x, k=k, flag=flag)
    out = mixed_job["outputs"]
    np.testing.assert_allclose(out["y"], expected["y"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["kept"], expected["kept"].numpy(), rtol=1e-6)
    assert out["k2"] == [3, -4, 2**41 + 1] == expected["k2"].numpy().tolist()
    assert out["negative"] == expected["negative"].numpy().tolist()

    # Strings come back as JSON strings, or {"b64": ...} where the bytes are not UTF-8.
    assert text_job["outputs"] == {
        "chars": [3, 3],
        "id": [VOCABULARY.index("one"), -1],
        "upper": ["ONE", "éTé"],  # tf.strings.upper changes ASCII letters only
        "head": ["o", {"b64": base64.b64encode(b"\xc3").decode()}],
    }
    assert text.serve(text=["one", "été"])["upper"].numpy().tolist() == [b"ONE", "éTé".encode()]
    assert bytes_job["outputs"]["upper"] == [{"b64": "/w=="}]
    assert text_b64["outputs"]["upper"] == [
        {"b64": base64.b64encode(b"ONE").decode()},
        {"b64": base64.b64encode("éTé".encode()).decode()},
    ]

    scores, probability = kfile({"a": a, "b": b})
    np.testing.assert_allclose(keras_job["outputs"]["scores"], np.asarray(scores), rtol=1e-5)
    np.testing.assert_allclose(
        keras_job["outputs"]["probability"], np.asarray(probability), rtol=1e-5
    )

    probabilities, lengths = frozen(image, np.array([b"\xc3\xa9", b""], dtype=object))
    np.testing.assert_allclose(
        frozen_job["outputs"]["probabilities"], probabilities.numpy(), rtol=1e-6
    )
    assert frozen_job["outputs"]["lengths"] == lengths.numpy().tolist() == [2, 0]

    # The Python client: NumPy strings and bytes in, object arrays of bytes out.
    with Client(fleet.url, api_key=fleet.api_key) as client:
        outputs = client.run("text", np.array(["two", "three"]), timeout=60)
        binary = client.run("text", np.array([b"\xff\xfe", b"zero"], dtype=object), timeout=60)
    assert outputs["upper"].dtype == object
    assert outputs["upper"].tolist() == [b"TWO", b"THREE"]
    assert outputs["id"].tolist() == [2, 3]
    assert binary["upper"].tolist() == [b"\xff\xfe", b"ZERO"]
    assert (
        binary["chars"].tolist()
        == text.serve(text=[b"\xff\xfe", b"zero"])["chars"].numpy().tolist()
    )
