"""Headless Chromium for the dashboard tests (Debian's chromium and chromium-driver).

Tests that need it take the `browser` fixture of their module; where chromium, its
driver or selenium is missing they skip and say which.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
# Where each page's screenshot goes: docs/screenshots/ with QUEEN_SCREENSHOTS=docs (to
# refresh the docs' pictures), else a folder of the run's own, so tests leave the tree clean.
SCREENSHOTS = (
    DOCS_SCREENSHOTS if os.environ.get("QUEEN_SCREENSHOTS") == "docs"
    else Path(tempfile.gettempdir()) / f"queen-screenshots-{os.getpid()}"
)
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
WINDOW = (1280, 900)


def missing() -> str | None:
    """Say what is missing for browser tests (None: nothing)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if not any(shutil.which(name) for name in CHROMIUM):
        return "chromium is not installed (apt-get install chromium chromium-driver)"
    if not shutil.which("chromedriver"):
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Start one headless Chromium through chromedriver; quit it afterwards."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    binary = next(shutil.which(name) for name in CHROMIUM if shutil.which(name))
    options.binary_location = str(binary)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}", "--disable-extensions",
                 "--no-first-run", "--disable-background-networking"):
        options.add_argument(flag)
    service = Service(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(check: Callable[[], Any], seconds: float = 20, what: str = "condition") -> Any:
    """Poll check() until it returns something truthy; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as exc:  # noqa: BLE001 - the page may be mid-render
            last = exc
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen in {seconds}s (last error: {last!r})")


def text_of(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def find_all(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def screenshot(driver: Any, name: str) -> Path:
    """Save the whole page as <name>.png in SCREENSHOTS."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    metrics = {"width": WINDOW[0], "height": max(WINDOW[1], min(height, 2400)),
               "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return path
