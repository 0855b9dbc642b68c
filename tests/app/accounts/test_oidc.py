"""OpenID Connect sign-in against an identity provider served over real HTTP by the test.

The provider here is the test's own (discovery, JWKS, authorize and token endpoints on a
real socket, ID tokens signed by RSA keys it makes with joserfc), not an installed product:
every check of the ID token is tried against it, key rotation included.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from pydantic import SecretStr
from sqlalchemy import func, select

from app.accounts.models import AuthToken, OidcIdentity, OidcLogin, Role, User
from app.audit.models import AuditEvent
from app.main import create_app
from app.settings import Settings
from support.platforms import Platform, make_user

CLIENT_ID = "nebula"
CLIENT_SECRET = "provider-client-secret"
LOGIN = "/api/v1/auth/oidc/login"


@dataclass
class Provider:
    """A small OpenID provider: what it signs with, publishes, and puts in the next token."""

    issuer: str = ""
    signing: RSAKey = field(
        default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "k1"})
    )
    published: list[RSAKey] = field(default_factory=list)
    person: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    raw_token: str | None = None
    codes: dict[str, dict[str, str]] = field(default_factory=dict)
    verifiers_seen: list[str] = field(default_factory=list)
    jwks_fetches: int = 0

    def __post_init__(self) -> None:
        self.published = [self.signing]
        self.person = {
            "sub": "subject-ada",
            "email": "ada@example.org",
            "email_verified": True,
            "name": "Ada Lovelace",
            "groups": ["researchers"],
        }

    def rotate(self) -> None:
        """A new signing key replaces the old one in the JWKS."""
        self.signing = RSAKey.generate_key(2048, parameters={"kid": secrets.token_hex(4)})
        self.published = [self.signing]

    def id_token(self, nonce: str) -> str:
        if self.raw_token is not None:
            return self.raw_token
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": nonce,
            **self.person,
            **self.overrides,
        }
        claims = {k: v for k, v in claims.items() if v is not None}
        return jwt.encode({"alg": "RS256", "kid": self.signing.kid}, claims, self.signing)


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/.well-known/openid-configuration":
                self._json(
                    200,
                    {
                        "issuer": provider.issuer,
                        "authorization_endpoint": f"{provider.issuer}/authorize",
                        "token_endpoint": f"{provider.issuer}/token",
                        "jwks_uri": f"{provider.issuer}/jwks",
                        "response_types_supported": ["code"],
                        "id_token_signing_alg_values_supported": ["RS256"],
                    },
                )
            elif url.path == "/jwks":
                provider.jwks_fetches += 1
                self._json(200, KeySet(provider.published).as_dict(private=False))
            elif url.path == "/authorize":
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                code = secrets.token_urlsafe(16)
                provider.codes[code] = query
                back = (
                    f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query['state']})}"
                )
                self.send_response(302)
                self.send_header("Location", back)
                self.end_headers()
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
            if self.headers.get("Authorization") != f"Basic {basic}":
                self._json(401, {"error": "invalid_client"})
                return
            asked = provider.codes.pop(form.get("code", ""), None)
            verifier = form.get("code_verifier", "")
            challenge = (
                base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
                .rstrip(b"=")
                .decode()
            )
            if asked is None or asked["code_challenge"] != challenge:
                self._json(400, {"error": "invalid_grant"})
                return
            provider.verifiers_seen.append(verifier)
            self._json(
                200,
                {
                    "access_token": "at",
                    "token_type": "Bearer",
                    "expires_in": 300,
                    "id_token": provider.id_token(asked["nonce"]),
                },
            )

    return Handler


@pytest.fixture
def provider() -> Iterator[Provider]:
    found = Provider()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(found))
    found.issuer = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def sso_settings(settings: Settings, provider: Provider, **extra: Any) -> Settings:
    return settings.model_copy(
        update={
            "public_url": "http://testserver",
            "oidc_issuer": provider.issuer,
            "oidc_client_id": CLIENT_ID,
            "oidc_client_secret": SecretStr(CLIENT_SECRET),
            "oidc_provider_name": "Example University",
            "oidc_admin_group": "nebula-admins",
            "oidc_auditor_group": "nebula-auditors",
            **extra,
        }
    )


@pytest.fixture
def sso(settings: Settings, provider: Provider) -> Iterator[TestClient]:
    app = create_app(sso_settings(settings, provider))
    with TestClient(app) as test_client:
        yield test_client
    app.state.engine.dispose()


def start(client: TestClient) -> str:
    """Begin a sign-in and let the provider answer; the callback path Nebula gets back."""
    began = client.get(LOGIN, follow_redirects=False)
    assert began.status_code == 302, began.text
    at_provider = httpx.get(began.headers["location"], follow_redirects=False)
    assert at_provider.status_code == 302
    back = urlsplit(at_provider.headers["location"])
    assert back.netloc == "testserver"
    return f"{back.path}?{back.query}"


def sign_in(client: TestClient) -> httpx.Response:
    return client.get(start(client), follow_redirects=False)


def refusals(platform: Platform) -> list[str]:
    with platform.factory() as db:
        rows = db.scalars(
            select(AuditEvent.details).where(
                AuditEvent.action == "auth.oidc", AuditEvent.outcome == "failure"
            )
        ).all()
    return [row["reason"] for row in rows]


def sessions(platform: Platform) -> int:
    with platform.factory() as db:
        return db.scalar(select(func.count()).select_from(AuthToken)) or 0


def test_first_sign_in_creates_a_member_and_lands_on_workspaces(
    sso: TestClient, provider: Provider, settings: Settings
) -> None:
    info = sso.get("/api/v1/auth/oidc").json()
    assert info == {"enabled": True, "provider_name": "Example University", "password_login": True}
    began = sso.get(LOGIN, follow_redirects=False)
    query = parse_qs(urlsplit(began.headers["location"]).query)
    assert query["code_challenge_method"] == ["S256"] and query["response_type"] == ["code"]
    assert query["client_id"] == [CLIENT_ID] and "openid" in query["scope"][0]
    assert "nebula_oidc_state" in began.headers["set-cookie"]
    assert "samesite=lax" in began.headers["set-cookie"].lower()
    sso.cookies.clear()

    answer = sign_in(sso)
    assert answer.status_code == 303 and answer.headers["location"] == "/workspaces"
    me = sso.get("/api/v1/me")
    assert me.status_code == 200
    assert me.json()["email"] == "ada@example.org" and me.json()["role"] == "member"
    assert len(provider.verifiers_seen) == 1  # PKCE: the verifier matched the challenge
    platform = Platform(sso, settings)
    with platform.factory() as db:
        identity = db.scalar(select(OidcIdentity))
        assert identity is not None and identity.subject == "subject-ada"
        assert identity.issuer == provider.issuer
        login = db.scalars(
            select(AuditEvent.details).where(
                AuditEvent.action == "auth.login", AuditEvent.outcome == "success"
            )
        ).one()
        # the sign-in that came back is spent; only the first, never finished, is left
        assert db.scalar(select(func.count()).select_from(OidcLogin)) == 1
    assert login == {"via": "oidc", "provider": provider.issuer, "subject": "subject-ada"}
    # the account has no password: password sign-in cannot reach it
    refused = sso.post(
        "/api/v1/auth/login", json={"email": "ada@example.org", "password": "anything-at-all-1"}
    )
    assert refused.status_code == 401


def test_the_group_claim_maps_roles(
    sso: TestClient, provider: Provider, settings: Settings
) -> None:
    provider.person["groups"] = ["nebula-admins"]
    assert sign_in(sso).status_code == 303
    assert sso.get("/api/v1/me").json()["role"] == "admin"
    sso.cookies.clear()
    provider.person["groups"] = ["nebula-auditors"]
    assert sign_in(sso).status_code == 303
    assert sso.get("/api/v1/me").json()["role"] == "auditor"


def test_an_existing_account_is_linked_by_its_verified_email(
    sso: TestClient, provider: Provider, settings: Settings
) -> None:
    platform = Platform(sso, settings)
    alice = platform.user(email="alice@example.org")
    provider.person.update(sub="subject-alice", email="Alice@Example.org")
    assert sign_in(sso).status_code == 303
    assert sso.get("/api/v1/me").json()["id"] == alice.id
    platform.login(alice.email)  # the password keeps working beside the linked identity


def test_signing_key_rotation_keeps_sign_in_working(sso: TestClient, provider: Provider) -> None:
    assert sign_in(sso).status_code == 303
    sso.cookies.clear()
    fetched = provider.jwks_fetches
    provider.rotate()
    assert sign_in(sso).status_code == 303
    assert provider.jwks_fetches == fetched + 1  # the unknown key id fetched the JWKS again
    assert sso.get("/api/v1/me").status_code == 200


def _alg_none(provider: Provider) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"iss": provider.issuer, "aud": CLIENT_ID, "sub": "x", "iat": now, "exp": now + 60}
    return f"{part({'alg': 'none'})}.{part(claims)}."


REFUSALS = {
    "issuer": lambda p: p.overrides.update(iss="http://127.0.0.1:1"),
    "audience": lambda p: p.overrides.update(aud="someone-else"),
    "expired": lambda p: p.overrides.update(exp=int(time.time()) - 3600),
    "not_yet_valid": lambda p: p.overrides.update(iat=int(time.time()) + 3600),
    "unverified_email": lambda p: p.person.update(email_verified=False),
    "signature": lambda p: setattr(
        p, "signing", RSAKey.generate_key(2048, parameters={"kid": p.signing.kid})
    ),
    "algorithm": lambda p: setattr(p, "raw_token", _alg_none(p)),
    "oversized": lambda p: p.overrides.update(padding="x" * 20_000),
}


@pytest.mark.parametrize("reason", sorted(REFUSALS))
def test_a_bad_id_token_is_refused_with_a_page_and_an_audit_row(
    sso: TestClient, provider: Provider, settings: Settings, reason: str
) -> None:
    REFUSALS[reason](provider)
    answer = sign_in(sso)
    assert answer.status_code in (401, 403), answer.text
    assert answer.headers["content-type"].startswith("text/html")
    assert "Sign-in refused" in answer.text
    platform = Platform(sso, settings)
    assert refusals(platform) == [reason]
    assert sessions(platform) == 0
    with platform.factory() as db:
        assert db.scalar(select(func.count()).select_from(OidcIdentity)) == 0
        assert db.scalar(select(func.count()).select_from(User)) == 0
    assert sso.get("/api/v1/me").status_code == 401


def test_a_replayed_nonce_is_refused(
    sso: TestClient, provider: Provider, settings: Settings
) -> None:
    first = start(sso)
    used_nonce = next(iter(provider.codes.values()))["nonce"]
    assert sso.get(first, follow_redirects=False).status_code == 303
    sso.cookies.clear()
    provider.overrides["nonce"] = used_nonce  # an ID token from the earlier sign-in
    answer = sign_in(sso)
    assert answer.status_code == 401
    assert refusals(Platform(sso, settings)) == ["nonce"]


def test_a_replayed_or_forged_callback_is_refused(
    sso: TestClient, provider: Provider, settings: Settings
) -> None:
    callback = start(sso)
    assert sso.get(callback, follow_redirects=False).status_code == 303
    sso.cookies.clear()
    replay = sso.get(callback, follow_redirects=False)  # same state and code again
    assert replay.status_code == 400
    path = "/api/v1/auth/oidc/callback"
    for query in (
        {"state": "short", "code": "c"},
        {"state": "A" * 43, "code": "has spaces in it"},
        {"state": "A" * 43, "code": ""},
        {"state": "<script>" * 4, "code": "c"},
    ):
        answer = sso.get(path, params=query, follow_redirects=False)
        assert answer.status_code == 400, query
        assert "<script>" not in answer.text
    assert sso.get(path, params={"state": "A" * 600, "code": "c"}).status_code == 422
    # a state that began in another browser (no cookie here) is refused, and spent
    other = start(sso)
    sso.cookies.clear()
    assert sso.get(other, follow_redirects=False).status_code == 400
    platform = Platform(sso, settings)
    assert sessions(platform) == 1
    assert set(refusals(platform)) == {"state", "malformed"}


def test_an_uninvited_person_is_refused_when_invitations_are_required(
    settings: Settings, provider: Provider
) -> None:
    app = create_app(sso_settings(settings, provider, oidc_create_users=False))
    with TestClient(app) as client:
        platform = Platform(client, app.state.settings)
        answer = sign_in(client)
        assert answer.status_code == 403
        assert "invited" in answer.text
        assert refusals(platform) == ["not_invited"]
        client.cookies.clear()
        platform.user(email="ada@example.org")  # an admin invites her by making the account
        assert sign_in(client).status_code == 303
    app.state.engine.dispose()


def test_an_admin_may_require_single_sign_on(settings: Settings, provider: Provider) -> None:
    app = create_app(sso_settings(settings, provider, require_sso=True))
    with TestClient(app) as client:
        platform = Platform(client, app.state.settings)
        make_user(platform.factory, app.state.settings, email="bob@example.org", role=Role.member)
        refused = client.post(
            "/api/v1/auth/login",
            json={"email": "bob@example.org", "password": "violet-harbor-cinnamon-42"},
        )
        assert refused.status_code == 403
        assert client.get("/api/v1/auth/oidc").json()["password_login"] is False
        assert sign_in(client).status_code == 303
    app.state.engine.dispose()
