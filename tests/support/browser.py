"""A running site for the browser tests: a `nebula up`, its admin's API client, and
Chromium pages signed in as anyone (tests/e2e/)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from support.platforms import PASSWORD
from support.servers import NebulaUp

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

# `make screenshots` refreshes docs/screenshots; ordinary test runs leave the tree untouched
SCREENSHOTS = Path(
    os.environ.get("NEBULA_SCREENSHOTS_DIR", Path(tempfile.gettempdir()) / "nebula-screenshots")
)
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@dataclass
class User:
    id: str
    email: str
    role: str
    password: str = PASSWORD


class Site:
    """A running `nebula up`, its admin's API client, and browser pages signed in as anyone."""

    DESKTOP = DESKTOP
    PHONE = PHONE

    def __init__(self, up: NebulaUp, browser: Browser) -> None:
        self.up = up
        self.url = up.url
        self.browser = browser
        self.api = httpx.Client(base_url=f"{up.url}/api/v1", timeout=30)
        login = self.api.post("/auth/login", json=up.admin)
        assert login.status_code == 200, login.text
        self.admin_headers = {"Authorization": f"Bearer {login.json()['token']}"}
        self.admin = User(
            id=login.json()["user"]["id"],
            email=up.admin["email"],
            role="admin",
            password=up.admin["password"],
        )
        self.contexts: list[BrowserContext] = []

    def make_user(self, name: str, role: str = "member") -> User:
        """A user made through the REST API by the admin, as an operator would."""
        email = f"{name}@example.org"
        answer = self.api.post(
            "/users",
            headers=self.admin_headers,
            json={"email": email, "display_name": name.title(), "role": role, "password": PASSWORD},
        )
        assert answer.status_code == 201, answer.text
        return User(id=answer.json()["id"], email=email, role=role)

    def bearer(self, user: User) -> dict[str, str]:
        answer = self.api.post("/auth/login", json={"email": user.email, "password": user.password})
        assert answer.status_code == 200, answer.text
        return {"Authorization": f"Bearer {answer.json()['token']}"}

    def page(self, viewport: dict[str, int] | None = None) -> Page:
        """A fresh browser context (its own cookies) at a fixed viewport."""
        context = self.browser.new_context(
            viewport=viewport or DESKTOP,
            base_url=self.url,
            locale="en-GB",
            timezone_id="UTC",
            color_scheme="light",
        )
        context.set_default_timeout(15_000)
        self.contexts.append(context)
        return context.new_page()

    def sign_in(self, user: User, viewport: dict[str, int] | None = None) -> Page:
        """A page signed in through the sign-in form."""
        page = self.page(viewport)
        page.goto("/")
        page.get_by_label("Email").fill(user.email)
        page.get_by_label("Password").fill(user.password)
        page.get_by_role("button", name="Sign in").click()
        page.locator("nav").get_by_text(user.email).wait_for(state="attached")
        return page

    def screenshot(self, page: Page, name: str, **options: Any) -> Path:
        """Writes <name>.png (to docs/screenshots with `make screenshots`) once fonts load."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.evaluate("document.fonts.ready")
        page.screenshot(path=str(path), animations="disabled", caret="hide", **options)
        return path

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        self.api.close()
