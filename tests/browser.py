"""A real headless browser for the dashboards' tests: Debian's chromium, driven by Selenium
through Debian's chromedriver (no browser is downloaded). Missing in CI is a failure (.ci/setup
installs both); elsewhere the test is skipped."""

from __future__ import annotations

import os
import shutil
from typing import Iterator

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def headless_browser() -> Iterator:
    """A Selenium Chrome driver, quit afterwards (use as a pytest fixture's body)."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: .ci/setup installs them (Debian's chromium, "
                        "chromium-driver)")
        pytest.skip("needs Debian's chromium and chromium-driver (bash .ci/setup installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1150",
                 "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
