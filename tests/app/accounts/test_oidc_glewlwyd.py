"""Single sign-on against a real OpenID provider: Debian's glewlwyd, run by the test.

The provider (tests/support/identity.py) runs from its own SQLite database, with a
client registered for Nebula and people in it. A person signs in at the provider (its
login API, with the session cookie it sets), the provider's authorization endpoint sends
the browser back to Nebula with a code, and Nebula takes it from there. Skipped where glewlwyd is not
installed (`apt-get install -y glewlwyd`), unless NEBULA_TEST_REQUIRE_GLEWLWYD=1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select

from app.accounts.models import AuthToken, OidcIdentity
from app.audit.models import AuditEvent
from app.main import create_app
from app.settings import Settings
from support.identity import CLIENT_ID, CLIENT_SECRET, NEEDS_GLEWLWYD, Glewlwyd, run_glewlwyd
from support.platforms import Platform

pytestmark = NEEDS_GLEWLWYD


@pytest.fixture(scope="module")
def glewlwyd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Glewlwyd]:
    with run_glewlwyd(tmp_path_factory.mktemp("glewlwyd")) as provider:
        yield provider


def _client(settings: Settings, provider: Glewlwyd, **extra: Any) -> tuple[TestClient, Any]:
    app = create_app(
        settings.model_copy(
            update={
                "public_url": "http://testserver",
                "oidc_issuer": provider.issuer,
                "oidc_client_id": CLIENT_ID,
                "oidc_client_secret": SecretStr(CLIENT_SECRET),
                "oidc_provider_name": "Glewlwyd",
                "oidc_admin_group": "nebula-admins",
                **extra,
            }
        )
    )
    return TestClient(app), app


def sign_in(client: TestClient, provider: Glewlwyd, username: str) -> httpx.Response:
    began = client.get("/api/v1/auth/oidc/login", follow_redirects=False)
    assert began.status_code == 302, began.text
    back = urlsplit(provider.authorize(username, began.headers["location"]))
    return client.get(f"{back.path}?{back.query}", follow_redirects=False)


@pytest.fixture
def nebula(settings: Settings, glewlwyd: Glewlwyd) -> Iterator[TestClient]:
    client, app = _client(settings, glewlwyd)
    with client:
        yield client
    app.state.engine.dispose()


def test_a_person_signs_in_through_glewlwyd(
    nebula: TestClient, glewlwyd: Glewlwyd, settings: Settings
) -> None:
    answer = sign_in(nebula, glewlwyd, "ada")
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/workspaces"
    me = nebula.get("/api/v1/me").json()
    assert (me["email"], me["role"]) == ("ada@example.org", "member")
    assert nebula.get("/api/v1/workspaces").status_code == 200
    platform = Platform(nebula, settings)
    with platform.factory() as db:
        identity = db.scalar(select(OidcIdentity))
        assert identity is not None and identity.issuer == glewlwyd.issuer
        details = db.scalars(
            select(AuditEvent.details).where(
                AuditEvent.action == "auth.login", AuditEvent.outcome == "success"
            )
        ).one()
    assert details["provider"] == glewlwyd.issuer and details["subject"] == identity.subject[:64]


def test_the_admin_group_makes_an_admin(nebula: TestClient, glewlwyd: Glewlwyd) -> None:
    assert sign_in(nebula, glewlwyd, "grace").status_code == 303
    assert nebula.get("/api/v1/me").json()["role"] == "admin"


def test_an_unverified_email_is_refused(
    nebula: TestClient, glewlwyd: Glewlwyd, settings: Settings
) -> None:
    answer = sign_in(nebula, glewlwyd, "mallory")
    assert answer.status_code == 403 and "not verified" in answer.text
    with Platform(nebula, settings).factory() as db:
        reasons = db.scalars(select(AuditEvent.details).where(AuditEvent.action == "auth.oidc"))
        assert [r["reason"] for r in reasons] == ["unverified_email"]
        assert db.scalars(select(AuthToken)).all() == []


def test_an_uninvited_person_is_refused(settings: Settings, glewlwyd: Glewlwyd) -> None:
    client, app = _client(settings, glewlwyd, oidc_create_users=False)
    with client:
        answer = sign_in(client, glewlwyd, "ada")
        assert answer.status_code == 403 and "invited" in answer.text
    app.state.engine.dispose()


def test_sign_in_keeps_working_after_the_provider_rotates_its_key(
    nebula: TestClient, glewlwyd: Glewlwyd
) -> None:
    assert sign_in(nebula, glewlwyd, "ada").status_code == 303
    before = httpx.get(f"{glewlwyd.issuer}/jwks").json()["keys"][0]["kid"]
    glewlwyd.rotate_key()
    after = httpx.get(f"{glewlwyd.issuer}/jwks").json()["keys"][0]["kid"]
    assert before != after
    nebula.cookies.clear()
    assert sign_in(nebula, glewlwyd, "ada").status_code == 303
    assert nebula.get("/api/v1/me").json()["email"] == "ada@example.org"
