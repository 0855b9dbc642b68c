"""Single sign-on against a real OpenID provider: Debian's glewlwyd, run by the test.

The provider runs from its own SQLite database (Debian's init script), with an OpenID
Connect plugin signing with an RSA key the test makes, a confidential client registered
for Nebula, and people in it. A person signs in at the provider (its login API, with
the session cookie it sets), the provider's authorization endpoint sends the browser back
to Nebula with a code, and Nebula takes it from there. Skipped where glewlwyd is not
installed (`apt-get install -y glewlwyd`), unless NEBULA_TEST_REQUIRE_GLEWLWYD=1.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select

from app.accounts.models import AuthToken, OidcIdentity
from app.audit.models import AuditEvent
from app.main import create_app
from app.settings import Settings
from support import Platform

GLEWLWYD = shutil.which("glewlwyd")
INIT_SQL = Path("/usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz")
BASE_CONF = Path("/etc/glewlwyd/glewlwyd.conf")
CLIENT_ID = "nebula"
CLIENT_SECRET = "nebula-client-secret-at-glewlwyd"
CALLBACK = "http://testserver/api/v1/auth/oidc/callback"
PEOPLE = {
    # username: (email, email_verified, groups)
    "ada": ("ada@example.org", "1", ["researchers"]),
    "grace": ("grace@example.org", "1", ["nebula-admins"]),
    "mallory": ("mallory@example.org", "0", ["researchers"]),
}
PASSWORD = "glewlwyd-user-password-1"

pytestmark = pytest.mark.skipif(
    GLEWLWYD is None and os.environ.get("NEBULA_TEST_REQUIRE_GLEWLWYD") != "1",
    reason="glewlwyd is not installed (apt-get install -y glewlwyd)",
)


def _pem_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@dataclass
class Glewlwyd:
    """A running provider and its admin session."""

    url: str  # http://127.0.0.1:PORT
    admin: httpx.Client

    @property
    def api(self) -> str:
        return f"{self.url}/api"

    @property
    def issuer(self) -> str:
        return f"{self.api}/oidc"

    def plugin(self, private_pem: str, public_pem: str) -> dict[str, Any]:
        return {
            "module": "oidc",
            "name": "oidc",
            "display_name": "OpenID Connect",
            "enabled": True,
            "parameters": {
                "iss": self.issuer,
                "jwt-type": "rsa",
                "jwt-key-size": "256",
                "key": private_pem,
                "cert": public_pem,
                "code-duration": 600,
                "refresh-token-duration": 1209600,
                "access-token-duration": 3600,
                "auth-type-code-enabled": True,
                "auth-type-client-enabled": False,
                "auth-type-implicit-enabled": False,
                "auth-type-password-enabled": False,
                "auth-type-refresh-enabled": True,
                "pkce-allowed": True,
                "pkce-method-plain-allowed": False,
                "email-claim": "mandatory",
                "name-claim": "mandatory",
                "claims": [
                    {
                        "name": "email_verified",
                        "user-property": "email_verified",
                        "type": "boolean",
                        "boolean-value-true": "1",
                        "boolean-value-false": "0",
                        "mandatory": True,
                        "on-demand": False,
                        "scope": [],
                    },
                    {
                        "name": "groups",
                        "user-property": "groups",
                        "type": "string",
                        "mandatory": True,
                        "on-demand": False,
                        "scope": [],
                    },
                ],
            },
        }

    def rotate_key(self) -> None:
        """Replace the provider's signing key (a new kid in its JWKS)."""
        answer = self.admin.put(f"{self.api}/mod/plugin/oidc", json=self.plugin(*_pem_pair()))
        assert answer.status_code == 200, answer.text
        reloaded = self.admin.put(f"{self.api}/mod/plugin/oidc/reset")  # the running instance
        assert reloaded.status_code == 200, reloaded.text

    def authorize(self, username: str, authorize_url: str) -> str:
        """Sign `username` in at the provider and follow its authorization endpoint: the
        URL it sends the browser back to Nebula with."""
        person = httpx.Client()
        signed_in = person.post(
            f"{self.api}/auth/", json={"username": username, "password": PASSWORD}
        )
        assert signed_in.status_code == 200, signed_in.text
        granted = person.put(f"{self.api}/auth/grant/{CLIENT_ID}", json={"scope": "openid"})
        assert granted.status_code == 200, granted.text
        answer = person.get(authorize_url + "&g_continue", follow_redirects=False)
        assert answer.status_code == 302, answer.text
        back: str = answer.headers["location"]
        assert back.startswith(CALLBACK), back
        return back


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def glewlwyd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Glewlwyd]:
    assert GLEWLWYD is not None, "glewlwyd is not installed"
    home = tmp_path_factory.mktemp("glewlwyd")
    database = home / "glewlwyd.db"
    with sqlite3.connect(database) as db:
        db.executescript(gzip.decompress(INIT_SQL.read_bytes()).decode())
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    conf = BASE_CONF.read_text()
    conf = conf.replace("port=4593", f"port={port}")
    conf = conf.replace('external_url="http://localhost:4593/"', f'external_url="{url}"')
    conf = conf.replace('log_mode="file"', 'log_mode="console"')
    conf = conf.replace(
        '@include "/etc/glewlwyd/glewlwyd-db.conf"',
        f'database = {{ type = "sqlite3" path = "{database}" }};',
    )
    (home / "glewlwyd.conf").write_text(conf)
    log = (home / "glewlwyd.log").open("wb")
    process = subprocess.Popen(
        [GLEWLWYD, f"--config-file={home / 'glewlwyd.conf'}"], stdout=log, stderr=log
    )
    admin = httpx.Client()
    deadline = time.monotonic() + 30
    while True:
        try:
            if (
                admin.post(
                    f"{url}/api/auth/", json={"username": "admin", "password": "password"}
                ).status_code
                == 200
            ):
                break
        except httpx.TransportError:
            pass
        assert process.poll() is None, (home / "glewlwyd.log").read_text()
        assert time.monotonic() < deadline, "glewlwyd did not start"
        time.sleep(0.1)
    provider = Glewlwyd(url=url, admin=admin)
    try:
        made = admin.post(f"{provider.api}/mod/plugin/", json=provider.plugin(*_pem_pair()))
        assert made.status_code == 200, made.text
        client = {
            "client_id": CLIENT_ID,
            "name": "Nebula",
            "confidential": True,
            "password": CLIENT_SECRET,
            "redirect_uri": [CALLBACK],
            "authorization_type": ["code", "authorization_code", "refresh_token"],
            "token_endpoint_auth_method": ["client_secret_basic"],
            "scope": ["openid"],
            "enabled": True,
        }
        assert admin.post(f"{provider.api}/client/", json=client).status_code == 200
        # the user store keeps only the properties its data format names
        module = admin.get(f"{provider.api}/mod/user/database").json()
        data_format = module["parameters"]["data-format"]
        data_format["email_verified"] = {"multiple": False, "read": True, "write": True}
        data_format["groups"] = {"multiple": True, "read": True, "write": True}
        assert admin.put(f"{provider.api}/mod/user/database", json=module).status_code == 200
        assert admin.put(f"{provider.api}/mod/user/database/reset").status_code == 200
        for username, (email, verified, groups) in PEOPLE.items():
            person = {
                "username": username,
                "password": PASSWORD,
                "name": username.title(),
                "email": email,
                "enabled": True,
                "scope": ["openid"],
                "email_verified": verified,
                "groups": groups,
            }
            made = admin.post(f"{provider.api}/user/", json=person)
            assert made.status_code == 200, made.text
        yield provider
    finally:
        admin.close()
        process.terminate()
        process.wait(timeout=30)
        log.close()


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
