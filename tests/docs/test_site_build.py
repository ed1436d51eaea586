"""The documentation site builds with `mkdocs build --strict` with no network at all, and holds
its four parts, the generated reference and its search index, and nothing fetched from elsewhere.

The build runs in a network namespace of its own (`unshare -n`, as root): a theme or plugin that
reached out for a font, a script or a page would fail it. CI runs as root, so there it must run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

pytestmark = pytest.mark.slow  # a whole site build: about ten seconds

# The attributes by which a page loads something as it opens (links a reader follows are fine).
_LOADS = {
    "script": "src",
    "link": "href",
    "img": "src",
    "iframe": "src",
    "source": "src",
    "audio": "src",
    "video": "src",
    "embed": "src",
}
_CSS_REMOTE = re.compile(r"(?:@import\s+|url\(\s*)[\"']?(?:https?:)?//", re.IGNORECASE)


def _unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{reason}; CI runs as root with util-linux and must build the site offline")
    pytest.skip(reason)


def _offline() -> list[str]:
    """The command prefix that cuts the network, or a skip (a failure in CI) saying why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        _unavailable("no unshare (util-linux)")
    if os.geteuid() != 0:
        _unavailable("unshare -n needs root")
    if subprocess.run([unshare, "-n", "true"], capture_output=True, check=False).returncode:
        _unavailable("unshare -n is not allowed here")
    return [unshare, "-n"]


def _nav_pages(nav: list[object]) -> Iterator[str]:
    for entry in nav:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from _nav_pages(value) if isinstance(value, list) else [str(value)]


class _Loads(HTMLParser):
    """The URLs a page loads as it opens, and whether it holds a diagram for mermaid."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.mermaid = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        navigation = tag == "link" and found.get("rel") in ("canonical", "prev", "next")
        if tag in _LOADS and found.get(_LOADS[tag]) and not navigation:
            self.urls.append(found[_LOADS[tag]] or "")
        # Material fetches mermaid.js from a CDN for any page that has one.
        if "mermaid" in (found.get("class") or "").split():
            self.mermaid = True


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs tools are in the dev extra")
    out = tmp_path_factory.mktemp("docs") / "site"
    command = [*_offline(), sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_every_page_of_the_nav_is_built_in_its_four_parts(site: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = list(_nav_pages(config["nav"]))
    for part in ("tutorial.md", "how-to/", "reference/", "explanation/"):
        assert any(p.startswith(part) for p in pages), f"the nav has no {part}"
    for page in pages:
        source = Path(page)
        built = source.parent if source.name == "index.md" else source.with_suffix("")
        assert (site / built / "index.html").is_file(), f"{page} was not built"
    for generated in ("http", "cli", "configuration", "metrics"):
        assert (site / "reference" / generated / "index.html").is_file()


def test_the_search_index_is_built_and_holds_the_generated_reference(site: Path) -> None:
    index = json.loads((site / "search/search_index.json").read_text(encoding="utf-8"))
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    assert {"reference/configuration/", "reference/http/", "tutorial/"} <= locations
    assert any("TFFLEET_LEASE_S" in doc["title"] for doc in index["docs"])
    assert list((site / "assets/javascripts/workers").glob("search*.js")), "no search worker"


def test_nothing_is_loaded_from_another_site(site: Path) -> None:
    for page in site.rglob("*.html"):
        loads = _Loads()
        loads.feed(page.read_text(encoding="utf-8"))
        remote = [u for u in loads.urls if urlsplit(u).scheme != "data" and urlsplit(u).netloc]
        assert not remote, f"{page.relative_to(site)} loads {remote}"
        assert not loads.mermaid, f"{page.relative_to(site)} has a mermaid diagram (a CDN script)"
    for sheet in site.rglob("*.css"):
        found = _CSS_REMOTE.search(sheet.read_text(encoding="utf-8"))
        assert found is None, f"{sheet.relative_to(site)} loads {found and found.group(0)}"
