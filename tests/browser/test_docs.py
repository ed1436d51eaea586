"""/docs in a real browser that reaches nothing but loopback, as on an air-gapped cluster.

Swagger UI must render from what the API serves itself: not one file from a CDN.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.conftest import Fleet

pytestmark = pytest.mark.slow

CDN_SCRIPT = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _loaded_urls(browser: webdriver.Chrome) -> list[str]:
    """The document's URL and every resource the page fetched, as the browser recorded them."""
    urls: list[str] = browser.execute_script(
        "return [document.URL, ...performance.getEntriesByType('navigation'),"
        " ...performance.getEntriesByType('resource')].map(e => typeof e === 'string' ? e : e.name)"
    )
    return urls


def test_docs_render_with_every_file_from_the_api(
    browser: webdriver.Chrome, fleet_factory: Callable[..., Fleet], sqlite_url: str, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    fleet = fleet_factory(sqlite_url, models)
    fleet.start_api()

    browser.get(f"{fleet.url}/docs")

    def rendered(driver: webdriver.Chrome) -> bool:
        if driver.find_elements(By.CSS_SELECTOR, ".opblock"):
            return True
        text = driver.find_element(By.TAG_NAME, "body").text
        assert "Unable to render" not in text and "Failed to load" not in text, text
        return False

    WebDriverWait(browser, 30).until(rendered, "Swagger UI rendered no operation")
    paths = {
        element.get_attribute("data-path")
        for element in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    }
    assert {"/v1/jobs", "/v2/models/{name}/infer"} <= paths, sorted(p or "" for p in paths)

    urls = _loaded_urls(browser)
    foreign = [url for url in urls if _origin(url) != fleet.url]
    assert not foreign, f"/docs loaded files from other origins: {foreign}"
    loaded = {urlsplit(url).path for url in urls}
    assert {
        "/docs",
        "/openapi.json",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/swagger-ui.css",
    } <= loaded, sorted(loaded)
    # Nothing failed to load either (a failed load has a resource entry too, and a console error).
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe

    # The page and its assets take no API key, as /openapi.json does not.
    for path in ("/docs", "/docs/assets/swagger-ui-bundle.js", "/docs/assets/favicon-32x32.png"):
        assert httpx.get(f"{fleet.url}{path}").status_code == 200, path
    assert httpx.get(f"{fleet.url}/redoc").status_code == 404


# The network cut: it must block, or the test above proves nothing on a machine that is online.


class _Probe(BaseHTTPRequestHandler):
    """Serves /page.html (given) and /probe.js; records the path of every request."""

    page = b""
    requested: list[str] = []  # each server's own: see _probe_server

    def do_GET(self) -> None:
        self.requested.append(self.path)
        if self.path == "/page.html":
            body, kind = self.page, "text/html"
        else:
            body, kind = b"/* probe */", "text/javascript"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def _probe_server(page: Callable[[int], str]) -> Iterator[tuple[int, list[str]]]:
    """A server in this process on every address of this machine: (its port, the paths asked)."""
    requested: list[str] = []
    handler = type("Probe", (_Probe,), {"requested": requested})
    server = ThreadingHTTPServer(("0.0.0.0", 0), handler)
    port = server.server_address[1]
    handler.page = page(port).encode()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port, requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine off loopback, if it has one (from iproute2's `ip`)."""
    ip = shutil.which("ip")
    if ip is None:
        return None
    listed = subprocess.run(
        [ip, "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    ).stdout
    for line in listed.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


# Each script's outcome, by its data-name, in `loaded` (a script's load and error events do not
# bubble: the document sees them in their capture phase; the window never sees a load).
_RECORD_LOADS = """
var loaded = {};
for (const [kind, outcome] of [["load", "loaded"], ["error", "failed"]]) {
  document.addEventListener(kind, e => { loaded[e.target.dataset.name] = outcome; }, true);
}
"""


def test_the_browser_reaches_nothing_but_loopback(browser: webdriver.Chrome) -> None:
    address = _non_loopback_address()
    scripts = {"loopback": "/probe.js?loopback", "cdn": CDN_SCRIPT}

    def page(port: int) -> str:
        if address is not None:
            # This machine, but off loopback: reachable (checked below) to all but the browser.
            scripts["address"] = f"http://{address}:{port}/probe.js?address"
        tags = "".join(
            f'<script src="{src}" data-name="{name}"></script>' for name, src in scripts.items()
        )
        return f"<!DOCTYPE html><html><head><script>{_RECORD_LOADS}</script>{tags}</head></html>"

    with _probe_server(page) as (port, requested):
        if address is not None:
            response = httpx.get(f"http://{address}:{port}/probe.js?control", timeout=10)
            assert response.status_code == 200  # reachable outside the browser
        browser.get(f"http://127.0.0.1:{port}/page.html")
        outcome: dict[str, str] = WebDriverWait(browser, 30).until(
            lambda d: (
                (got := d.execute_script("return loaded")) and len(got) == len(scripts) and got
            ),
            f"not every script of {sorted(scripts)} loaded or failed",
        )
        urls = _loaded_urls(browser)

    want = {name: "failed" for name in scripts} | {"loopback": "loaded"}
    assert outcome == want, outcome
    assert "/probe.js?address" not in requested, requested
    # What the page tried and failed to load is in its resource entries too: the check of /docs
    # above would see a CDN file even where it cannot be fetched.
    assert CDN_SCRIPT in urls, urls
    foreign = {url for url in urls if _origin(url) != f"http://127.0.0.1:{port}"}
    assert foreign == {src for src in scripts.values() if src.startswith("http")}, urls
    if address is None:
        pytest.skip("checked names only: this machine has no address off loopback")
