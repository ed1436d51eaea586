"""reference/metrics.md: every Prometheus metric that api/ and worker/ define.

The modules that import prometheus_client at their top are imported (none of them may import
TensorFlow: this checks), and the metrics read from what they define: each metric object
(Counter, Gauge, Histogram, ...) and each custom collector class, by its `describe()`.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gen_reference.markdown import anchor, code, paragraphs, summary, table, text

PACKAGES = ("api", "worker")

INTRO = """\
Generated at build time from the metrics that the modules of `api/` and `worker/` define, so it
lists every metric. Where each is scraped:

- the API: `GET /metrics` (with an admin key, unless `TFFLEET_METRICS_PUBLIC`), every API
  process's values merged under `tffleet api --workers N`;
- the worker's main process: its children's metrics, on `TFFLEET_WORKER_METRICS_PORT`;
- the sweeper (and its webhook deliverer): on `tffleet sweeper --metrics-port`.

A counter is scraped as its name with `_total` (and `_created`, when it started); a histogram as
`_bucket`, `_sum` and `_count` series. The client library's own process metrics (`process_*`,
`python_*`) are served beside them.
"""

_SUFFIX = {"counter": "_total", "info": "_info"}


@dataclass
class Found:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    module: str
    buckets: tuple[float, ...] = ()


def repository_root() -> Path:
    """The folder that holds api/ and worker/, as imported (the work tree, or an install)."""
    return Path(importlib.import_module(PACKAGES[0]).__file__ or "").resolve().parents[1]


def metric_modules(root: Path) -> list[str]:
    """The modules of PACKAGES that import prometheus_client at their top level."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                )  # fmt: skip
                if any(n.split(".")[0] == "prometheus_client" for n in names):
                    module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
                    found.append(module.removesuffix(".__init__"))
                    break
    return found


def collect(root: Path) -> Iterator[Found]:
    from prometheus_client.metrics import MetricWrapperBase
    from prometheus_client.registry import Collector

    for name in metric_modules(root):
        had_tensorflow = "tensorflow" in sys.modules
        module = importlib.import_module(name)
        if "tensorflow" in sys.modules and not had_tensorflow:
            raise RuntimeError(f"importing {name} imported TensorFlow: keep it out of {name}")
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                yield Found(
                    value._name, str(value._type), tuple(value._labelnames), value._documentation,
                    name, tuple(getattr(value, "_upper_bounds", ())),
                )  # fmt: skip
            elif (
                isinstance(value, type)
                and Collector in value.__mro__
                and value.__module__ == name
                and "describe" in vars(value)
            ):
                # describe() says what a collector yields without collecting (which may read a
                # database): called on an instance that was never set up.
                collector: Any = value
                for family in collector.describe(collector.__new__(collector)):
                    labels = tuple(getattr(family, "_labelnames", ()))
                    yield Found(family.name, family.type, labels, family.documentation, name)


def scraped_name(found: Found) -> str:
    return found.name + _SUFFIX.get(found.kind, "")


def render() -> str:
    root = repository_root()
    metrics = sorted(collect(root), key=lambda f: (f.module, f.name))
    out = [
        f"# Metrics\n\n{INTRO}",
        table(
            ["Metric", "Type", "Labels", "Help"],
            [
                [
                    f"[{code(scraped_name(f))}](#{anchor(scraped_name(f))})",
                    f.kind,
                    ", ".join(code(label) for label in f.labels),
                    text(f.help),
                ]
                for f in sorted(metrics, key=lambda f: f.name)
            ],
        ),
    ]
    modules = list(dict.fromkeys(f.module for f in metrics))
    for module in modules:
        doc = summary(importlib.import_module(module).__doc__)
        path = module.replace(".", "/") + ".py"
        out.append(f"## `{module}`\n\n{paragraphs(doc)} Defined in `{path}`.".strip())
        for f in (f for f in metrics if f.module == module):
            out.append(f"### `{scraped_name(f)}` {{ #{anchor(scraped_name(f))} }}")
            facts = [f"Type {code(f.kind)}"]
            facts.append(
                "labels " + ", ".join(code(label) for label in f.labels) if f.labels
                else "no labels"
            )  # fmt: skip
            if f.buckets:
                facts.append("buckets " + ", ".join(code(_bound(b)) for b in f.buckets))
            out.append(text(f.help.rstrip(".") + ".") + " " + "; ".join(facts) + ".")
    return "\n\n".join(out) + "\n"


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else f"{value:g}"


def names(root: Path) -> list[str]:
    """Every metric's name as defined (for the test that checks the page lists them)."""
    return [f.name for f in collect(root)]
