"""The generated reference pages list all that the code has: every route, setting, command, metric.

The pages are made as a site build makes them (docs/hooks/reference.py, in a process of its own);
what they must list is read here from the code directly, so a page that drops one fails.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="the docs tools are in the dev extra")
pytestmark = pytest.mark.slow  # the pages are made in a process of their own


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference_hook", ROOT / "docs/hooks/reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return _hook().generate(ROOT)


def sections(page: str) -> dict[str, str]:
    """Each `#`-heading's code span (`GET /v1/jobs`, `tffleet up`, ...) -> the text under it."""
    found: dict[str, str] = {}
    parts = re.split(r"^(#{1,6} .*)$", page, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        titled = re.match(r"#+ `([^`]+)`", heading)
        if titled:
            found[titled.group(1)] = body
    return found


def test_every_operation_of_the_schema_has_its_section_with_its_parameters_and_statuses(
    pages: dict[str, str],
) -> None:
    from api.app import create_app

    spec = create_app().openapi()
    found = sections(pages["reference/http.md"])
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method not in ("get", "put", "post", "delete", "patch", "head", "options"):
                continue
            title = f"{method.upper()} {path}"
            assert title in found, f"reference/http.md has no section for {title}"
            body = found[title]
            for param in op.get("parameters", []):
                assert f"`{param['name']}`" in body, f"{title}: parameter {param['name']}"
            for kind in op.get("requestBody", {}).get("content", {}):
                assert f"`{kind}`" in body, f"{title}: request body {kind}"
            for status in op.get("responses", {}):
                assert f"`{status}`" in body, f"{title}: status {status}"
            assert op.get("description"), f"{title} has no docstring (its OpenAPI description)"


def test_every_route_the_app_serves_is_listed_schema_or_not(pages: dict[str, str]) -> None:
    from api.app import create_app

    page = pages["reference/http.md"]
    for route in create_app().routes:
        # FastAPI 0.12x+ keeps an included router whole: its routes come from here.
        contexts = getattr(route, "effective_route_contexts", None)
        for found in contexts() if contexts else [route]:
            # A parameter's converter (`{path:path}`: one that holds `/`) is no part of its name.
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", getattr(found, "path", ""))
            assert f"{path}`" in page, f"reference/http.md does not list {path}"


def test_every_setting_has_its_section_its_default_and_words(pages: dict[str, str]) -> None:
    from tffleet.settings import Settings

    found = sections(pages["reference/configuration.md"])
    prefix = Settings.model_config["env_prefix"]
    for name, info in Settings.model_fields.items():
        variable = f"{prefix}{name}".upper()
        assert variable in found, f"reference/configuration.md has no section for {variable}"
        body = found[variable].strip()
        assert f"`Settings.{name}`" in body
        if not info.is_required() and info.default is not None:
            default = str(info.default).lower() if isinstance(info.default, bool) else info.default
            assert f"default `{default}`" in body, f"{variable}: its default"
        # Its own words or its group's (a comment above it in tffleet/settings.py).
        assert "\n\n" in body, f"{variable} has no description: a comment above it in settings.py"


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ("tffleet",)
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(words), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*words, name))


def test_every_command_has_its_section_with_every_option(pages: dict[str, str]) -> None:
    from tffleet.cli.main import build_parser

    found = sections(pages["reference/cli.md"])
    commands = list(_commands(build_parser()))
    assert len(commands) > 10
    for command, parser in commands:
        assert command in found, f"reference/cli.md has no section for {command}"
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            for name in action.option_strings or [str(action.metavar or action.dest)]:
                assert f"`{name}`" in found[command], f"{command}: {name}"


def _defined_metric_names() -> set[str]:
    """Every `tffleet_*` string in the modules of api/ and worker/ that import prometheus_client."""
    names: set[str] = set()
    for package in ("api", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imports = [
                n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)
            ]  # fmt: skip
            modules = [a.name for n in imports if isinstance(n, ast.Import) for a in n.names] + [
                n.module or "" for n in imports if isinstance(n, ast.ImportFrom)
            ]
            if not any(m.split(".")[0] == "prometheus_client" for m in modules):
                continue
            names |= {
                node.value
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"tffleet_[a-z0-9_]+", node.value)
            }
    return names


def test_every_metric_has_its_section(pages: dict[str, str]) -> None:
    names = _defined_metric_names()
    assert "tffleet_jobs_submitted_total" in names and "tffleet_jobs_queued" in names
    found = sections(pages["reference/metrics.md"])
    for name in sorted(names):
        assert any(title.startswith(name) for title in found), f"reference/metrics.md: {name}"


def test_the_reference_index_links_every_generated_page(pages: dict[str, str]) -> None:
    index = (ROOT / "docs/reference/index.md").read_text(encoding="utf-8")
    for path in pages:
        assert f"]({Path(path).name})" in index, f"reference/index.md does not link {path}"
