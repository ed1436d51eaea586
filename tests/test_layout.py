"""The plan of the house (ARCHITECTURE.md): which part may import which.

    tffleet.cli ──▶ api, worker, db, tffleet.client, kernel     (nothing imports the CLI)
    api ──────────▶ db, kernel
    worker ───────▶ db, kernel                                  (api and worker never meet)
    db ───────────▶ kernel
    tffleet.client ▶ kernel
    kernel (tffleet/*.py) ▶ nothing of ours

Imports inside functions count too: a lazy import is still a dependency.

Two more rules keep the rooms small and the plan a plan: no module of `api/`, `db/`, `worker/` or
`tffleet/` over 400 lines (the migrations aside), and no import circle among our modules, of any
length. Importing a module runs the `__init__` of each package above it, so an import depends on
those packages too (`from db.jobs import claim`, `claim` a module, depends on `db.jobs.claim` and
on `db.jobs`). A package's own modules do not depend on the packages that hold them, which are
running already when they are imported, unless they take a name from one (`from db.jobs import
get` inside `db/jobs/` closes a circle through `db/jobs/__init__.py`; `from db.jobs import claim`
there does not). An import under `if TYPE_CHECKING:` never runs, so it closes no circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "db", "worker", "tffleet")
MAX_LINES = 400
CHECKING = {"TYPE_CHECKING", "typing.TYPE_CHECKING"}

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
    for package in PACKAGES:
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


def test_no_module_is_over_400_lines() -> None:
    long = []
    for _, path in modules():
        where = path.relative_to(ROOT)
        if where.parts[:2] == ("db", "migrations"):
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long.append(f"{where}: {lines} lines")
    assert not long, f"modules over {MAX_LINES} lines (one idea per module):\n" + "\n".join(long)


def run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:`, which never run (types only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and ast.unparse(node.test) in CHECKING:
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)


def dependencies(name: str, path: Path, ours: Mapping[str, Path]) -> Iterator[tuple[int, str]]:
    """The modules of ours that importing `name` (at `path`) runs, each with its import's line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def holds(outer: str) -> bool:
        return name.startswith(outer + ".")

    def running(module: str, line: int) -> Iterator[tuple[int, str]]:
        """`module` and the packages above it, but those that hold `name` (running already)."""
        parts = module.split(".")
        for end in range(1, len(parts)):
            if not holds(outer := ".".join(parts[:end])):
                yield line, outer
        yield line, module

    found: list[tuple[int, str]] = []
    for node in run_time_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += running(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative: from the package `level - 1` steps above this one's
                above = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*above, *([source] if source else [])])
            named = [f"{source}.{alias.name}" for alias in node.names]
            found += [(node.lineno, module) for module in named if module in ours]
            # Only its modules, from a package that holds this one: its __init__ is not read.
            if not (holds(source) and all(module in ours for module in named)):
                found += running(source, node.lineno)
    for line, module in found:
        if module in ours and module != name:
            yield line, module


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    ours = dict(modules())
    edges: dict[str, dict[str, int]] = {name: {} for name in ours}
    for name, path in ours.items():
        for line, module in dependencies(name, path, ours):
            edges[name][module] = min(line, edges[name].get(module, line))
    report = []
    for component in circles({name: set(targets) for name, targets in edges.items()}):
        files = [str(ours[name].relative_to(ROOT)) for name in component]
        how = [
            f"  {ours[name].relative_to(ROOT)}:{line} imports {target}"
            for name in component
            for target, line in sorted(edges[name].items())
            if target in component
        ]
        report.append(" <-> ".join(files) + "\n" + "\n".join(how))
    assert not report, "import circles:\n" + "\n".join(report)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_a_circle_is_every_module_on_it(
    graph: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert sorted(circles(graph)) == expected


def test_a_module_depends_on_the_packages_its_import_runs(tmp_path: Path) -> None:
    ours = {
        name: tmp_path / "x.py"
        for name in ("db", "db.jobs", "db.jobs.claim", "db.jobs.reads", "db.parts")
    }
    source = tmp_path / "x.py"

    def deps(name: str, code: str, *, init: bool = False) -> set[str]:
        path = tmp_path / "__init__.py" if init else source
        path.write_text(code)
        return {module for _, module in dependencies(name, path, ours)}

    assert deps("db.parts", "from db.jobs import claim") == {"db.jobs", "db.jobs.claim"}
    assert deps("db.parts", "import db.jobs.claim") == {"db.jobs", "db.jobs.claim"}
    assert deps("db.parts", "def f():\n    from db.jobs import get") == {"db.jobs"}
    # Inside the package its __init__ is running already: a circle only if a name is taken from it.
    assert deps("db.jobs.claim", "from db.jobs.reads import get") == {"db.jobs.reads"}
    assert deps("db.jobs.claim", "from db.jobs import reads") == {"db.jobs.reads"}
    assert deps("db.jobs.claim", "from . import reads") == {"db.jobs.reads"}
    assert deps("db.jobs.claim", "from db.jobs import get") == {"db.jobs"}
    assert deps("db.jobs.claim", "from . import get, reads") == {"db.jobs", "db.jobs.reads"}
    assert deps("db.jobs.claim", "import db.jobs") == {"db.jobs"}
    assert deps("db.jobs", "from .claim import x", init=True) == {"db.jobs.claim"}
    checking = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from db import parts\n"
    assert deps("db.jobs.claim", checking + "else:\n    from db import jobs") == {"db.jobs"}
