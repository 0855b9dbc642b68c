"""Single sign-on in Chromium: Nebula's sign-in page, glewlwyd's own login page, back to Nebula.

One `nebula up` configured for a real OpenID provider (Debian's glewlwyd, run by
tests/support/identity.py with a client whose redirect URI is this Nebula's callback). The
browser follows every redirect itself: nothing is signed in through an API on its behalf.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from support.browser import Site
from support.identity import (
    CLIENT_ID,
    CLIENT_SECRET,
    NEEDS_GLEWLWYD,
    PASSWORD,
    PEOPLE,
    Glewlwyd,
    run_glewlwyd,
)
from support.servers import NebulaUp

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails) with the reason
    expect = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = [
    pytest.mark.slow,
    NEEDS_GLEWLWYD,
]


@pytest.fixture(scope="module")
def sso_site(
    browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Site, Glewlwyd]]:
    """`nebula up` signing people in through glewlwyd, and the provider."""
    up = NebulaUp(tmp_path_factory.mktemp("e2e-sso") / "site")
    callback = f"{up.url}/api/v1/auth/oidc/callback"
    with run_glewlwyd(tmp_path_factory.mktemp("glewlwyd"), callback=callback) as provider:
        up.env.update(
            NEBULA_PUBLIC_URL=up.url,
            NEBULA_OIDC_ISSUER=provider.issuer,
            NEBULA_OIDC_CLIENT_ID=CLIENT_ID,
            NEBULA_OIDC_CLIENT_SECRET=CLIENT_SECRET,
            NEBULA_OIDC_PROVIDER_NAME="Glewlwyd",
        )
        with up:
            site = Site(up, browser)
            try:
                yield site, provider
            finally:
                site.close()


def test_a_person_signs_in_at_the_providers_login_page(
    sso_site: tuple[Site, Glewlwyd],
) -> None:
    site, provider = sso_site
    email = PEOPLE["ada"][0]
    page = site.page()
    page.goto("/")
    page.get_by_role("link", name="Sign in with Glewlwyd").click()

    # glewlwyd's own login page, on its own origin
    page.wait_for_url(lambda url: url.startswith(f"{provider.url}/login.html"))
    page.get_by_placeholder("Your username").fill("ada")
    page.get_by_placeholder("Your password").fill(PASSWORD)
    page.get_by_role("button", name="OK", exact=True).click()
    # first visit: the provider names the client and asks the person to grant its scope
    expect(page.get_by_text("Nebula requires access to the following scopes")).to_be_visible()
    expect(page.get_by_text(site.url + "/api/v1/auth/oidc/callback")).to_be_visible()
    page.get_by_role("button", name="Grant access").click()
    page.get_by_role("button", name="Continue").click()

    # back at Nebula, signed in, on the workspaces page
    page.wait_for_url(f"{site.url}/workspaces")
    page.locator("nav").get_by_text(email).wait_for(state="attached")
    expect(page.get_by_role("heading", name="Workspaces")).to_be_visible()
    me = page.request.get("/api/v1/me")
    assert me.status == 200, me.text()
    assert (me.json()["email"], me.json()["role"]) == (email, "member")
