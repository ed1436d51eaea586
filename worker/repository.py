"""The model repository on disk: `<repo>/<name>/<version>/`, like TF Serving's and Triton's.

A version directory holds one model in one of three formats, told apart by its files:

    saved_model    a TF2 SavedModel (`saved_model.pb` and `variables/`)
    keras          one Keras v3 `.keras` file
    frozen_graph   a TF1 frozen GraphDef (`model.pb`), whose tensors model.toml names

An optional `<repo>/<name>/model.toml` sets per-model options (all optional):

    format = "frozen_graph"    # default: detected from the files
    signature = "serving_default"   # SavedModel: which signature to serve
    max_batch_size = 128
    max_queue_delay_ms = 2.0
    buckets = [1, 8, 32, 128]
    timeout_s = 300.0          # default TFFLEET_JOB_TIMEOUT_S; a batch running longer: `timeout`
    devices = ["gpu:0"]        # which worker children load it (as TFFLEET_DEVICES names them);
                               # default: every child
    versions = "latest"        # which versions to serve: "latest" (older ones drain and are
                               # unloaded), "all", or a list such as [1, 3]
    warmup = "warmup.npz"      # in the version directory: arrays named by input, batch first,
                               # run at every bucket size before the version takes jobs

    [inputs]                   # frozen graphs: the name clients use = the graph's tensor
    image = "input:0"
    [outputs]
    probabilities = "softmax:0"
    logits = "dense/BiasAdd:0"

This module only reads the file system; it never imports TensorFlow.
"""

from __future__ import annotations

import logging
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
# ASCII digits without a leading zero ("01" would be a second version 1; str.isdigit() also takes
# "²", which int() refuses), small enough for the database's INTEGER column.
_VERSION = re.compile(r"[1-9][0-9]{0,8}")
CONFIG_FILE = "model.toml"
FORMATS = ("saved_model", "keras", "frozen_graph")
FROZEN_GRAPH_FILE = "model.pb"
_DEVICE = re.compile(r"(cpu|gpu):[0-9]+")


@dataclass(frozen=True)
class ModelConfig:
    # None: detected from the version directory's files (see detect_format).
    format: str | None = None
    signature: str = "serving_default"
    # Frozen graphs only: the name clients use -> the graph's tensor name ("input:0").
    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)
    max_batch_size: int = 128
    max_queue_delay_ms: float = 2.0
    buckets: tuple[int, ...] = ()
    # How long one forward pass of this model may run before its jobs end `timeout`.
    timeout_s: float = 300.0
    # The devices whose worker children load this model ("cpu:0", "gpu:1"); empty: every child.
    devices: tuple[str, ...] = ()
    # "latest", "all", or the version numbers to serve.
    versions: str | tuple[int, ...] = "latest"
    # An .npz file in the version directory with warm-up inputs; None: zeros (or empty strings).
    warmup: str | None = None
    # The response cache (db/cache.py): a job whose inputs equal a succeeded job's gets its
    # outputs at once; per tenant unless `cache_shared`.
    cache: bool = False
    cache_shared: bool = False

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

    def serves_device(self, device: str) -> bool:
        return not self.devices or device in self.devices

    def served_versions(self, available: Iterable[int]) -> list[int]:
        """Which of the versions on disk this policy serves, ascending."""
        versions = sorted(set(available))
        if self.versions == "all":
            return versions
        if self.versions == "latest":
            return versions[-1:]
        return [v for v in versions if v in self.versions]

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "signature": self.signature,
            "inputs": dict(self.inputs),
            "outputs": dict(self.outputs),
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_ms": self.max_queue_delay_ms,
            "buckets": list(self.bucket_sizes()),
            "timeout_s": self.timeout_s,
            "devices": list(self.devices),
            "versions": self.versions if isinstance(self.versions, str) else list(self.versions),
            "warmup": self.warmup,
            "cache": self.cache,
            "cache_shared": self.cache_shared,
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
    """The format of a version directory's files, or None when it holds no model."""
    if (path / "saved_model.pb").is_file():
        return "saved_model"
    if len(list(path.glob("*.keras"))) == 1:
        return "keras"
    if (path / FROZEN_GRAPH_FILE).is_file():
        return "frozen_graph"
    return None


_KNOWN_KEYS = frozenset(f.name for f in fields(ModelConfig))


def read_config(model_dir: Path, *, defaults: ModelConfig) -> ModelConfig:
    file = model_dir / CONFIG_FILE
    if not file.is_file():
        return defaults
    raw = tomllib.loads(file.read_text())
    unknown = set(raw) - _KNOWN_KEYS
    if unknown:
        raise ValueError(
            f"{file}: unknown keys {sorted(unknown)}; known keys are {sorted(_KNOWN_KEYS)}"
        )
    values = {**defaults.__dict__, **raw}
    problem = _check(values)
    if problem:
        raise ValueError(f"{file}: {problem}")
    values["buckets"] = tuple(values["buckets"])
    values["devices"] = tuple(values["devices"])
    if not isinstance(values["versions"], str):
        values["versions"] = tuple(values["versions"])
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
    fmt = values["format"]
    if fmt is not None and fmt not in FORMATS:
        return f"format must be one of {list(FORMATS)}, got {fmt!r}"
    for key in ("inputs", "outputs"):
        names = values[key]
        if not isinstance(names, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in names.items()
        ):
            return f"[{key}] must map names to tensor names (strings), got {names!r}"
    devices = values["devices"]
    if not isinstance(devices, list | tuple) or not all(
        isinstance(d, str) and _DEVICE.fullmatch(d) for d in devices
    ):
        return f'devices must be a list such as ["gpu:0", "cpu:0"], got {devices!r}'
    versions = values["versions"]
    if versions not in ("latest", "all") and not (
        isinstance(versions, list | tuple)
        and versions
        and all(_is_int(v) and v >= 1 for v in versions)
    ):
        return f'versions must be "latest", "all" or a list of version numbers, got {versions!r}'
    for flag in ("cache", "cache_shared"):
        if not isinstance(values[flag], bool):
            return f"{flag} must be true or false, got {values[flag]!r}"
    warmup = values["warmup"]
    if warmup is not None and (not isinstance(warmup, str) or not warmup.endswith(".npz")):
        return f"warmup must name an .npz file in the version directory, got {warmup!r}"
    return None


def scan(
    repository: Path,
    *,
    defaults: ModelConfig | None = None,
    problems: dict[Path, str] | None = None,
) -> list[ModelSpec]:
    """Every servable version in the repository. Unreadable entries are skipped: logged, or
    recorded in `problems` (path -> why) where given, by a caller that rescans and logs once."""
    defaults = defaults or ModelConfig()
    specs: list[ModelSpec] = []
    for name in model_names(repository):
        model_dir = repository / name
        try:
            config = read_config(model_dir, defaults=defaults)
        except (OSError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError included
            if problems is not None:
                problems[model_dir] = f"bad {CONFIG_FILE}: {exc}"
            else:
                log.error("skipping model %s: bad %s: %s", name, CONFIG_FILE, exc)
            continue
        for version_dir in sorted(_versions(model_dir), key=lambda d: int(d.name)):
            fmt = config.format or detect_format(version_dir)
            if fmt is None:
                why = f"no model in it (saved_model.pb, one .keras file, or {FROZEN_GRAPH_FILE})"
                if problems is not None:
                    problems[version_dir] = why
                else:
                    log.error("skipping %s: %s", version_dir, why)
                continue
            specs.append(ModelSpec(name, int(version_dir.name), version_dir, fmt, config))
    return specs
