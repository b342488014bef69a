"""The browser the page tests drive: Debian's chromium, headless, through
chromium-driver (``.ci/run`` installs both)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("CI") == "true" or os.environ.get("TURNLEDGER_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium and chromium-driver must be installed in CI (.ci/run does it)")
        pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1300"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
