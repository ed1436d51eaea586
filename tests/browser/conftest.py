"""A real headless Chromium, driven by Selenium, that reaches nothing but this machine's loopback.

The system's `chromium` and `chromedriver` (Debian's packages; .ci/run installs them), named by
path so that Selenium Manager never looks for, or downloads, a browser or a driver of its own.
Missing, they skip the tests on a laptop and fail them under CI=true.

The network is cut twice over, as on an air-gapped cluster, each cut enough alone: every host but
localhost and 127.0.0.1 fails to resolve (Chromium's resolver rules catch IP literals too), and
every request to anything but loopback goes to a proxy on 127.0.0.1:9, where nothing listens
(loopback is exempt from a proxy in Chromium by default; `--proxy-bypass-list=<-loopback>` would
send it to the dead proxy too). tests/browser/test_docs.py checks that the cut holds.

chromedriver inherits the test process's environment, run mark included (tests/services.py), and
Chromium inherits chromedriver's: a browser the fixture failed to quit is found and fails the run.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from tests.conftest import service_missing
from tests.e2e.conftest import fleet_factory

__all__ = ["browser", "fleet_factory"]

# Where Chromium's connections to anything but loopback go: the discard port, closed here.
DEAD_PROXY = "http://127.0.0.1:9"

FLAGS = (
    "--headless=new",
    "--no-sandbox",  # root in a container
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
    # The network cut: nothing resolves but localhost and 127.0.0.1, nothing else skips the proxy.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
    f"--proxy-server={DEAD_PROXY}",
    # Nothing of Chromium's own (updates, field trials, safe browsing) in the background.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
)


def chromium_paths() -> tuple[str, str]:
    """The paths of `chromium` and `chromedriver`, or a skip (a failure under CI=true)."""
    chromium = shutil.which("chromium")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        found = {
            ("chromium", "chromium"): chromium,
            ("chromedriver", "chromium-driver"): chromedriver,
        }
        missing = [names for names, path in found.items() if path is None]
        commands = " and ".join(command for command, _ in missing)
        packages = " ".join(package for _, package in missing)
        service_missing(
            "a headless browser",
            FileNotFoundError(f"no {commands} on PATH (Debian: apt-get install {packages})"),
        )
    assert chromium is not None and chromedriver is not None
    return chromium, chromedriver


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    """A headless Chromium with the network cut but loopback, quit after the test."""
    chromium, chromedriver = chromium_paths()
    options = Options()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    # The console, for the tests to read failed loads from (`browser.get_log("browser")`).
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Explicit paths: Selenium Manager is never asked for a browser or a driver.
    service = Service(executable_path=chromedriver)
    driver = webdriver.Chrome(options=options, service=service)  # stops chromedriver if it fails
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()  # Chromium, then chromedriver
