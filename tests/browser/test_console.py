"""The console in a real browser that reaches nothing but loopback, against a running fleet
(the API and a worker with TensorFlow): refused without an admin key, then showing a served
model, the device holding it, and a finished job's timeline and output shapes.

With TFFLEET_CONSOLE_SCREENSHOT=<path.png>, the test saves what the console shows, for a quick
look after a change to the page. README's screenshot (docs/console.png) is of a live fleet under
load instead: `make run`, some traffic, and the same browser.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as seen
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.conftest import Fleet
from tests.e2e.models import build_mlp

pytestmark = pytest.mark.slow


def _text(browser: webdriver.Chrome, css: str) -> str:
    return "\n".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, css))


def _wait_for_text(browser: webdriver.Chrome, css: str, text: str, timeout_s: float = 30) -> None:
    WebDriverWait(browser, timeout_s).until(
        lambda driver: text in _text(driver, css), f"{text!r} never showed in {css}"
    )


def _type(field: WebElement, text: str) -> None:
    field.clear()
    field.send_keys(text)


def test_the_console_shows_the_fleet_to_an_admin_key_and_nothing_without_one(
    browser: webdriver.Chrome,
    fleet_factory: Callable[..., Fleet],
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    build_mlp(tmp_path / "models")
    fleet = fleet_factory(sqlite_url, tmp_path / "models", devices="cpu:1")
    fleet.start_api()
    fleet.start_worker()
    x = np.random.default_rng(3).normal(size=(2, 8)).astype(np.float32)
    with fleet.http(timeout=60) as client:
        done = client.post("/v1/jobs?wait=30", json={"model": "mlp", "inputs": x.tolist()})
    assert done.json()["status"] == "succeeded", done.text
    job_id = done.json()["id"]

    browser.get(f"{fleet.url}/console")
    # No key: the form, nothing of the fleet.
    WebDriverWait(browser, 10).until(seen.visibility_of_element_located((By.ID, "login")))
    assert not browser.find_element(By.ID, "console").is_displayed()
    # A key that is not an admin's is refused by name.
    _type(browser.find_element(By.ID, "key"), "tff_not-a-key")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    _wait_for_text(browser, "#login-error", "The key was refused")
    assert not browser.find_element(By.ID, "console").is_displayed()

    _type(browser.find_element(By.ID, "key"), fleet.api_key)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    _wait_for_text(browser, "#models tbody", "mlp:1")
    models = _text(browser, "#models tbody")
    assert "served" in models and "cpu:0" in models, models
    _wait_for_text(browser, "#devices tbody", "cpu:0")
    assert "mlp:1 loaded" in _text(browser, "#devices tbody")
    assert "default" in _text(browser, "#tenants tbody")
    # What the fleet keeps: the database's size, and an ended job's inputs for an hour.
    storage = _text(browser, "#storage tbody")
    assert "Database" in storage and "until a job ends, then 1 h" in storage, storage
    # The throughput chart drew the minute's jobs: bars with a title saying how many.
    WebDriverWait(browser, 30).until(
        lambda driver: driver.find_elements(By.CSS_SELECTOR, "#throughput g title")
    )
    # The key is in the tab's session storage, never in the address.
    assert fleet.api_key not in browser.current_url
    stored = browser.execute_script("return sessionStorage.getItem('tffleet.adminKey')")
    assert stored == fleet.api_key

    _type(browser.find_element(By.ID, "job-id"), job_id)
    browser.find_element(By.CSS_SELECTOR, "#lookup button").click()
    _wait_for_text(browser, "#job", "Timeline")
    job = _text(browser, "#job")
    for expected in (job_id, "succeeded", "created", "started", "output_0: float32 [2, 3]"):
        assert expected in job, job

    # Every file came from the API itself (the network is cut but loopback anyway).
    urls = browser.execute_script(
        "return [document.URL, ...performance.getEntriesByType('resource').map(e => e.name)]"
    )
    origin = urlsplit(fleet.url).netloc
    assert all(urlsplit(url).netloc == origin for url in urls), urls
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    # The refused key's 401 is the one error the console logged; nothing failed to load.
    assert all("401" in e["message"] for e in severe), severe

    if screenshot := os.environ.get("TFFLEET_CONSOLE_SCREENSHOT"):
        browser.set_window_size(1280, 1000)
        browser.save_screenshot(screenshot)

    # Forgetting the key shows the form again.
    browser.find_element(By.ID, "forget").click()
    WebDriverWait(browser, 10).until(seen.visibility_of_element_located((By.ID, "login")))
    assert browser.execute_script("return sessionStorage.getItem('tffleet.adminKey')") is None
