"""End to end: a TF Serving client's predict, answered by the real worker and TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import SharedFleet

pytestmark = pytest.mark.slow


def test_a_tf_serving_predict_is_answered_with_the_models_own_outputs(
    shared_fleet: SharedFleet,
) -> None:
    fleet, model = shared_fleet.fleet, shared_fleet.built["mlp"]
    x = np.random.default_rng(3).normal(size=(3, 8)).astype(np.float32)

    with fleet.http(timeout=60) as client:
        rows = client.post("/v1/models/mlp:predict", json={"instances": x.tolist()})
        columns = client.post(
            "/v1/models/mlp/versions/1:predict", json={"inputs": {"x": x.tolist()}}
        )
        status = client.get("/v1/models/mlp")

    assert rows.status_code == 200, rows.text
    np.testing.assert_allclose(
        np.asarray(rows.json()["predictions"], dtype=np.float32), model(x), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(columns.json()["outputs"], dtype=np.float32), model(x), rtol=1e-5, atol=1e-6
    )
    assert status.json()["model_version_status"][0]["state"] == "AVAILABLE"
