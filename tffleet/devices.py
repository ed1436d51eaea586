"""Which devices the worker children serve, and how a child pins itself to one.

This module never imports TensorFlow or touches CUDA: it runs in the Celery main process.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "gpu"
    # CPU slot number, or the GPU's ordinal as CUDA numbers it for the worker: host index when
    # the worker starts without CUDA_VISIBLE_DEVICES, else a position in that list.
    index: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"


def _visible_gpus() -> list[str] | None:
    """The worker's own CUDA_VISIBLE_DEVICES as a list, or None when it is not set.

    CUDA stops at the first invalid entry, so "-1" (or anything after it) hides the rest.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    entries: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def count_host_gpus() -> int:
    """GPUs the NVIDIA driver exposes to this process, counted without loading CUDA."""
    visible = _visible_gpus()
    if visible is not None:
        return len(visible)
    try:
        return sum(1 for _ in _NVIDIA_GPUS_DIR.iterdir())
    except OSError:
        return 0


_COUNT = re.compile(r"[0-9]+")


def parse_devices(spec: str) -> list[Device]:
    """Parse `TFFLEET_DEVICES`: "cpu:N", "all", or comma-separated GPU indices like "0,1".

    GPU indices count the GPUs this worker may use: under CUDA_VISIBLE_DEVICES=2,3 "0" means the
    host's GPU 2, as it would for CUDA itself.
    """
    spec = spec.strip().lower()
    if spec.startswith("cpu:"):
        count = spec.removeprefix("cpu:").strip()
        if not _COUNT.fullmatch(count) or int(count) < 1:
            raise ValueError(f"devices: 'cpu:N' needs a positive slot count, got {spec!r}")
        return [Device("cpu", i) for i in range(int(count))]
    if spec == "all":
        gpus = count_host_gpus()
        return [Device("gpu", i) for i in range(gpus)] if gpus else [Device("cpu", 0)]
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or not all(_COUNT.fullmatch(p) for p in parts):
        raise ValueError(
            f"devices: expected 'cpu:N', 'all' or GPU indices such as '0,1', got {spec!r}"
        )
    return [Device("gpu", int(p)) for p in parts]


# TensorFlow with CUDA support probes for a GPU on its first use and logs a failed probe as an
# error (`E0000 ... failed call to cuInit: ... (303)` where no NVIDIA driver is installed), which
# CUDA_VISIBLE_DEVICES=-1 does not prevent. Leaving out its GPU device factories skips the probe,
# so nothing touches CUDA where no GPU is wanted; real errors are logged as before.
CPU_ONLY_ENVIRONMENT = {"CUDA_VISIBLE_DEVICES": "-1", "TF_ENABLED_DEVICE_TYPES": "CPU"}


def pin_environment(device: Device, *, cpu_threads: int) -> dict[str, str]:
    """The environment a child sets before importing TensorFlow, so it sees only its device.

    Read in the child before it changes its environment: a GPU ordinal is looked up in the
    CUDA_VISIBLE_DEVICES the worker was started with, if any.
    """
    gpu = "-1"  # a CPU slot hides every GPU
    if device.kind == "gpu":
        visible = _visible_gpus()
        if visible is None:
            gpu = str(device.index)
        elif device.index < len(visible):
            gpu = visible[device.index]
        else:
            raise ValueError(
                f"devices: GPU {device.index} is not among the {len(visible)} GPUs this worker "
                f"may use (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            )
    env = {
        # A GPU child sees exactly one GPU, which TensorFlow then calls GPU:0.
        "CUDA_VISIBLE_DEVICES": gpu,
        "TF_NUM_INTRAOP_THREADS": str(cpu_threads),
        "TF_NUM_INTEROP_THREADS": "1",
        "OMP_NUM_THREADS": str(cpu_threads),
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }
    if device.kind == "cpu":
        env.update(CPU_ONLY_ENVIRONMENT)
    return env


def cpu_threads_per_child(children: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, children))
