"""Browser tests: Debian's Chromium driven by Playwright against one `nebula up` per module."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.browser import Site
from support.servers import NebulaUp
from support.services import REQUIRE_SERVICES

if TYPE_CHECKING:
    from playwright.sync_api import Browser

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "frontend" / "dist"
CHROMIUM = os.environ.get("NEBULA_TEST_CHROMIUM", "/usr/bin/chromium")


def unavailable(message: str) -> None:
    """Skip with a clear reason, or fail when CI requires every part (as support.services does)."""
    if REQUIRE_SERVICES:
        pytest.fail(message + " and NEBULA_TEST_REQUIRE_SERVICES=1", pytrace=False)
    pytest.skip(message + "; set NEBULA_TEST_REQUIRE_SERVICES=1 to make this an error")


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless; no browser download."""
    if not (DIST / "index.html").is_file():
        unavailable(
            f"the web UI is not built ({DIST / 'index.html'} is missing): run `make frontend`"
        )
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)) and not shutil.which(
        CHROMIUM
    ):
        unavailable(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        unavailable(f"the playwright package is not installed ({exc})")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def site(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with NebulaUp(tmp_path_factory.mktemp("e2e") / "site") as up:
        running = Site(up, browser)
        try:
            yield running
        finally:
            running.close()
