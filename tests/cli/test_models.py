"""`tffleet models`: clear refusals of paths that hold no model, and the listing (no TensorFlow:
the model is loaded only once the path checks out; tests/e2e/test_versions.py loads one)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db import presence, registry
from db.clock import utcnow
from db.models import PresenceState
from tffleet import devices
from tffleet.cli import main, models
from tffleet.devices import CPU_ONLY_ENVIRONMENT


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("nope/1", "is not a directory; PATH is a model version directory"),
        ("m", "the directory name 'm' is not a version number"),
        ("m/1", "no model in it"),
        ("bad/1", "unknown keys ['bad']"),
    ],
)
def test_register_refuses_a_path_that_is_no_model_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, expected: str
) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "model.toml").write_text('bad = "keys"\n')

    assert main(["models", "register", str(tmp_path / path)]) == 2
    assert expected in capsys.readouterr().err


def test_register_refuses_a_version_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    assert main(["models", "register", str(tmp_path / "m" / "1"), "--version", "0"]) == 2
    assert "--version must be between 1 and" in capsys.readouterr().err


def test_list_shows_each_version_its_status_and_workers_and_the_load_errors(
    database: str, sessions: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    signature = {"x": {"dtype": "float32", "shape": [-1, 4]}}
    now = utcnow()
    with sessions.begin() as session:
        for version in (1, 2):
            registry.register(
                session=session,
                name="mlp",
                version=version,
                format="saved_model",
                inputs=signature,
                outputs=signature,
            )
        registry.retire(session=session, name="mlp", version=1)
        presence.report(
            session=session,
            child=presence.Child(id="h/1/cpu:0/x", host="h", pid=1, device="cpu:0"),
            holdings=[
                presence.Holding("mlp", 2, PresenceState.LOADED, "/m/mlp/2", now),
                presence.Holding("mlp", 3, PresenceState.FAILED, "/m/mlp/3", now, "OSError: no"),
            ],
        )

    assert main(["models", "list"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "MODEL",
        "VERSION",
        "FORMAT",
        "STATUS",
        "QUEUED",
        "RUNNING",
        "WORKERS",
    ]
    assert lines[1].split() == ["mlp", "1", "saved_model", "retired", "0", "0", "-"]
    assert lines[2].split() == [
        "mlp", "2", "saved_model", "serving,", "latest", "0", "0", "h", "cpu:0", "loaded",
    ]  # fmt: skip
    assert lines[-1] == "  mlp:3 on h cpu:0 (/m/mlp/3): OSError: no"


@pytest.mark.parametrize(("gpus", "skipped"), [(0, True), (2, False)])
def test_register_skips_the_cuda_probe_on_a_host_without_gpus(
    monkeypatch: pytest.MonkeyPatch, gpus: int, skipped: bool
) -> None:
    for name in CPU_ONLY_ENVIRONMENT:  # set, then unset: the test's end puts them back
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setattr(devices, "count_host_gpus", lambda: gpus)

    models._without_gpus_skip_the_cuda_probe()

    expected = CPU_ONLY_ENVIRONMENT if skipped else {}
    assert {k: os.environ[k] for k in CPU_ONLY_ENVIRONMENT if k in os.environ} == expected
