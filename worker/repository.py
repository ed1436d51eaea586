"""The model repository on disk: `<repo>/<name>/<version>/`, like TF Serving's and Triton's.

A version directory holds a TF2 SavedModel (`saved_model.pb`). An optional
`<repo>/<name>/model.toml` sets per-model options:

    signature = "serving_default"
    max_batch_size = 128
    max_queue_delay_ms = 2.0
    buckets = [1, 8, 32, 128]
    timeout_s = 300.0          # default TFFLEET_JOB_TIMEOUT_S; a batch running longer: `timeout`

This module only reads the file system; it never imports TensorFlow.
"""

from __future__ import annotations

import logging
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
# ASCII digits without a leading zero ("01" would be a second version 1; str.isdigit() also takes
# "²", which int() refuses), small enough for the database's INTEGER column.
_VERSION = re.compile(r"[1-9][0-9]{0,8}")
CONFIG_FILE = "model.toml"


@dataclass(frozen=True)
class ModelConfig:
    signature: str = "serving_default"
    max_batch_size: int = 128
    max_queue_delay_ms: float = 2.0
    buckets: tuple[int, ...] = ()
    # How long one forward pass of this model may run before its jobs end `timeout`.
    timeout_s: float = 300.0

    def bucket_sizes(self) -> tuple[int, ...]:
        """Padded batch sizes: powers of two up to max_batch_size unless configured."""
        if self.buckets:
            return tuple(
                sorted(
                    {b for b in self.buckets if b <= self.max_batch_size} | {self.max_batch_size}
                )
            )
        sizes = []
        size = 1
        while size < self.max_batch_size:
            sizes.append(size)
            size *= 2
        sizes.append(self.max_batch_size)
        return tuple(sizes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_ms": self.max_queue_delay_ms,
            "buckets": list(self.bucket_sizes()),
            "timeout_s": self.timeout_s,
        }


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: int
    path: Path
    format: str
    config: ModelConfig = field(default_factory=ModelConfig)


def model_names(repository: Path) -> list[str]:
    """Names of the models in the repository (directories with at least one version)."""
    if not repository.is_dir():
        return []
    return sorted(
        d.name
        for d in repository.iterdir()
        if d.is_dir() and _NAME.fullmatch(d.name) and any(_versions(d))
    )


def _versions(model_dir: Path) -> list[Path]:
    return [d for d in model_dir.iterdir() if d.is_dir() and _VERSION.fullmatch(d.name)]


def detect_format(path: Path) -> str | None:
    if (path / "saved_model.pb").is_file():
        return "saved_model"
    return None


def read_config(model_dir: Path, *, defaults: ModelConfig) -> ModelConfig:
    file = model_dir / CONFIG_FILE
    if not file.is_file():
        return defaults
    raw = tomllib.loads(file.read_text())
    known = {"signature", "max_batch_size", "max_queue_delay_ms", "buckets", "timeout_s"}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{file}: unknown keys {sorted(unknown)}; known keys are {sorted(known)}")
    values = {**defaults.__dict__, **raw}
    problem = _check(values)
    if problem:
        raise ValueError(f"{file}: {problem}")
    values["buckets"] = tuple(values["buckets"])
    values["timeout_s"] = float(values["timeout_s"])
    return ModelConfig(**values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(values: dict[str, Any]) -> str | None:
    """What is wrong with a config's values, or None. TOML has types: no silent conversion."""
    signature, size = values["signature"], values["max_batch_size"]
    delay, buckets = values["max_queue_delay_ms"], values["buckets"]
    timeout = values["timeout_s"]
    if not isinstance(signature, str) or not signature:
        return f"signature must be a non-empty string, got {signature!r}"
    if not _is_int(size) or size < 1:
        return f"max_batch_size must be an integer of at least 1, got {size!r}"
    number = _is_int(delay) or isinstance(delay, float)
    if not number or not math.isfinite(delay) or delay < 0:
        return f"max_queue_delay_ms must be a number of at least 0, got {delay!r}"
    if not isinstance(buckets, list | tuple) or not all(_is_int(b) and b >= 1 for b in buckets):
        return f"buckets must be a list of integers of at least 1, got {buckets!r}"
    number = _is_int(timeout) or isinstance(timeout, float)
    if not number or not math.isfinite(timeout) or timeout <= 0:
        return f"timeout_s must be a number above 0, got {timeout!r}"
    return None


def scan(repository: Path, *, defaults: ModelConfig | None = None) -> list[ModelSpec]:
    """Every servable version in the repository. Unreadable entries are logged and skipped."""
    defaults = defaults or ModelConfig()
    specs: list[ModelSpec] = []
    for name in model_names(repository):
        model_dir = repository / name
        try:
            config = read_config(model_dir, defaults=defaults)
        except (OSError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError included
            log.error("skipping model %s: bad %s: %s", name, CONFIG_FILE, exc)
            continue
        for version_dir in sorted(_versions(model_dir), key=lambda d: int(d.name)):
            fmt = detect_format(version_dir)
            if fmt is None:
                log.error("skipping %s: no saved_model.pb in it", version_dir)
                continue
            specs.append(ModelSpec(name, int(version_dir.name), version_dir, fmt, config))
    return specs
