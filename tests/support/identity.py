"""A real OpenID provider for the single sign-on tests: Debian's glewlwyd.

It runs from its own SQLite database (Debian's init script), with an OpenID Connect plugin
signing with an RSA key made here, a confidential client registered for Nebula, people in
it, and its own login pages. Used by tests/app/accounts/test_oidc_glewlwyd.py (through
Starlette's test client) and tests/e2e/test_sso.py (Chromium against `nebula up`).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from support.processes import running, spawn, stop_all, wait_until
from workers.ports import free_port

GLEWLWYD = shutil.which("glewlwyd")
WEBAPP = Path("/usr/share/glewlwyd/webapp")
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
NEEDS_GLEWLWYD = pytest.mark.skipif(
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
    callback: str  # Nebula's redirect URI, as registered for its client

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
        assert back.startswith(self.callback), back
        return back


def _webapp(home: Path) -> Path:
    """A copy of Debian's login pages (2.6 MB; glewlwyd serves no symbolic links) with its
    config.json as a file (the package installs config.json as a folder holding the file)."""
    webapp = home / "webapp"
    shutil.copytree(WEBAPP, webapp, ignore=shutil.ignore_patterns("config.json"))
    config = WEBAPP / "config.json"
    shutil.copyfile(config / "config.json" if config.is_dir() else config, webapp / "config.json")
    return webapp


@contextmanager
def run_glewlwyd(home: Path, callback: str = CALLBACK) -> Iterator[Glewlwyd]:
    """glewlwyd in `home` with its login pages, Nebula's client (redirect URI `callback`)
    and the people of PEOPLE; stopped on exit."""
    assert GLEWLWYD is not None, "glewlwyd is not installed"
    database = home / "glewlwyd.db"
    with sqlite3.connect(database) as db:
        db.executescript(gzip.decompress(INIT_SQL.read_bytes()).decode())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    conf = BASE_CONF.read_text()
    conf = conf.replace("port=4593", f"port={port}")
    conf = conf.replace('external_url="http://localhost:4593/"', f'external_url="{url}"')
    conf = conf.replace('log_mode="file"', 'log_mode="console"')
    # its own login page (login.html), which a browser is sent to
    conf = conf.replace(
        '# static_files_path="/usr/share/glewlwyd/webapp/"',
        f'static_files_path="{_webapp(home)}/"',
    )
    conf = conf.replace(
        '@include "/etc/glewlwyd/glewlwyd-db.conf"',
        f'database = {{ type = "sqlite3" path = "{database}" }};',
    )
    (home / "glewlwyd.conf").write_text(conf)
    log = home / "glewlwyd.log"
    argv = [GLEWLWYD, f"--config-file={home / 'glewlwyd.conf'}"]
    process = spawn(argv, log, env=os.environ, append=False)
    admin = httpx.Client()

    def signed_in() -> bool:
        try:
            answer = admin.post(
                f"{url}/api/auth/", json={"username": "admin", "password": "password"}
            )
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    provider = Glewlwyd(url=url, admin=admin, callback=callback)
    try:
        wait_until(
            signed_in,
            lambda: f"glewlwyd to start; its log:\n{log.read_text(errors='replace')}",
            30,
            interval=0.1,
            alive=running(process),
        )
        made = admin.post(f"{provider.api}/mod/plugin/", json=provider.plugin(*_pem_pair()))
        assert made.status_code == 200, made.text
        client = {
            "client_id": CLIENT_ID,
            "name": "Nebula",
            "confidential": True,
            "password": CLIENT_SECRET,
            "redirect_uri": [callback],
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
        stop_all([process], timeout=30)
