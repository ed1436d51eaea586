"""Parsing TFFLEET_DEVICES and the environment a worker child pins itself with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tffleet import devices
from tffleet.devices import Device, parse_devices, pin_environment


@pytest.fixture
def no_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A host whose driver exposes no GPU, and no CUDA_VISIBLE_DEVICES set."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "_NVIDIA_GPUS_DIR", tmp_path / "absent")


@pytest.fixture
def host_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A host whose driver exposes GPUs as entries of a directory the test fills."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    monkeypatch.setattr(devices, "_NVIDIA_GPUS_DIR", gpus)
    return gpus


def add_gpus(directory: Path, count: int) -> None:
    for i in range(count):
        (directory / f"0000:{i:02x}:00.0").mkdir()


@pytest.mark.parametrize(("spec", "count"), [("cpu:1", 1), ("cpu:2", 2), (" CPU:16 ", 16)])
def test_cpu_spec_gives_that_many_cpu_slots(spec: str, count: int) -> None:
    assert parse_devices(spec) == [Device("cpu", i) for i in range(count)]


def test_all_without_a_gpu_gives_one_cpu_slot(no_gpus: None) -> None:
    assert parse_devices("all") == [Device("cpu", 0)]


def test_all_gives_every_gpu_the_driver_exposes(host_gpus: Path) -> None:
    add_gpus(host_gpus, 3)
    assert parse_devices("all") == [Device("gpu", 0), Device("gpu", 1), Device("gpu", 2)]


@pytest.mark.parametrize(("visible", "count"), [("", 0), ("-1", 0), ("2,3", 2), ("1,-1,2", 1)])
def test_all_counts_only_the_gpus_cuda_visible_devices_leaves(
    host_gpus: Path, monkeypatch: pytest.MonkeyPatch, visible: str, count: int
) -> None:
    add_gpus(host_gpus, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    expected = [Device("gpu", i) for i in range(count)] or [Device("cpu", 0)]
    assert parse_devices("all") == expected


@pytest.mark.parametrize(
    ("spec", "indices"), [("0", [0]), ("0,1", [0, 1]), (" 1 , 3 ", [1, 3]), ("2,", [2])]
)
def test_gpu_indices_give_those_gpus(spec: str, indices: list[int]) -> None:
    assert parse_devices(spec) == [Device("gpu", i) for i in indices]


@pytest.mark.parametrize("spec", ["cpu:0", "cpu:", "cpu:-1", "cpu:two", "cpu:²", "cpu:1.5"])
def test_bad_cpu_count_raises_a_clear_value_error(spec: str) -> None:
    with pytest.raises(ValueError, match=r"devices: 'cpu:N' needs a positive slot count, got"):
        parse_devices(spec)


@pytest.mark.parametrize("spec", ["", " ", "gpu", "gpu:0", "0;1", "-1", "a,b", "1,x", "²"])
def test_bad_spec_raises_a_value_error_naming_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ValueError, match=r"expected 'cpu:N', 'all' or GPU indices such as '0,1'"):
        parse_devices(spec)


def test_bad_spec_message_quotes_the_spec() -> None:
    with pytest.raises(ValueError, match="'gpu:7'"):
        parse_devices("gpu:7")


def test_a_cpu_child_hides_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    env = pin_environment(Device("cpu", 3), cpu_threads=4)
    assert env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert env["TF_NUM_INTRAOP_THREADS"] == "4"
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["TF_NUM_INTEROP_THREADS"] == "1"


def test_a_gpu_child_sees_only_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = pin_environment(Device("gpu", 2), cpu_threads=2)
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["TF_NUM_INTRAOP_THREADS"] == "2"


def test_a_gpu_child_maps_its_index_through_the_workers_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,GPU-5ad1")
    pinned = [pin_environment(Device("gpu", i), cpu_threads=1) for i in range(3)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in pinned] == ["2", "3", "GPU-5ad1"]


def test_a_gpu_index_beyond_the_visible_devices_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(ValueError, match="GPU 2 is not among the 2 GPUs"):
        pin_environment(Device("gpu", 2), cpu_threads=1)


def test_pin_environment_keeps_a_chosen_tensorflow_log_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    assert pin_environment(Device("cpu", 0), cpu_threads=1)["TF_CPP_MIN_LOG_LEVEL"] == "0"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    assert pin_environment(Device("cpu", 0), cpu_threads=1)["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_cpu_threads_are_split_between_children_and_never_zero() -> None:
    assert devices.cpu_threads_per_child(1) >= 1
    assert devices.cpu_threads_per_child(10_000) == 1
    assert devices.cpu_threads_per_child(0) >= 1


def test_device_prints_as_kind_and_index() -> None:
    assert str(Device("gpu", 1)) == "gpu:1"


def test_a_cpu_child_leaves_out_tensorflows_gpu_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """So TensorFlow never probes CUDA there (an `E0000 ... failed call to cuInit` line on a host
    without an NVIDIA driver), and a GPU child still gets every device type."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert pin_environment(Device("cpu", 0), cpu_threads=1)["TF_ENABLED_DEVICE_TYPES"] == "CPU"
    assert "TF_ENABLED_DEVICE_TYPES" not in pin_environment(Device("gpu", 0), cpu_threads=1)
