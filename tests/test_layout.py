"""The plan of the house (ARCHITECTURE.md): which part may import which.

    tffleet.cli ──▶ api, worker, db, tffleet.client, kernel     (nothing imports the CLI)
    api ──────────▶ db, kernel
    worker ───────▶ db, kernel                                  (api and worker never meet)
    db ───────────▶ kernel
    tffleet.client ▶ kernel
    kernel (tffleet/*.py) ▶ nothing of ours

Imports inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = {
    "tffleet.cli": {"tffleet.cli", "api", "worker", "db", "tffleet.client", "tffleet"},
    "api": {"api", "db", "tffleet"},
    "worker": {"worker", "db", "tffleet"},
    "db": {"db", "tffleet"},
    "tffleet.client": {"tffleet.client", "tffleet"},
    "tffleet": {"tffleet"},
}


def part_of(module: str) -> str | None:
    """The part of the house a dotted module name belongs to (None: not ours)."""
    for part in ("tffleet.cli", "tffleet.client"):
        if module == part or module.startswith(part + "."):
            return part
    top = module.split(".")[0]
    return top if top in ALLOWED else None


def modules() -> Iterator[tuple[str, Path]]:
    for package in ("api", "db", "worker", "tffleet"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # `from tffleet import client` imports tffleet.client
                yield node.lineno, f"{node.module}.{alias.name}"


def test_each_part_imports_only_what_it_may() -> None:
    wrong: set[str] = set()
    for name, path in modules():
        mine = part_of(name)
        assert mine is not None, name
        if name == "tffleet":  # the package root re-exports the client, lazily (PEP 562)
            continue
        for line, imported in imports(path):
            theirs = part_of(imported)
            if theirs is not None and theirs not in ALLOWED[mine]:
                wrong.add(f"{path.relative_to(ROOT)}:{line} ({mine}) imports {theirs}")
    assert not wrong, "\n".join(sorted(wrong))


@pytest.mark.parametrize(
    ("module", "part"),
    [
        ("tffleet.cli.up", "tffleet.cli"),
        ("tffleet.client.job", "tffleet.client"),
        ("tffleet.broker", "tffleet"),
        ("worker.app", "worker"),
        ("celery", None),
    ],
)
def test_a_module_belongs_to_the_part_its_name_says(module: str, part: str | None) -> None:
    assert part_of(module) == part
