"""OpenID Connect sign-in: authorization code flow with PKCE, the ID token checked in full.

The browser is sent to the provider with a fresh `state` (also in a cookie of this
browser), `nonce` and PKCE verifier, kept in `oidc_logins` and used once. On its way
back, the code is exchanged at the provider's token endpoint (authlib), and the ID token
must pass every check before anything is written: its size, an asymmetric algorithm
(never `none` or HMAC), a signature by a key of the provider's JWKS (fetched again once
when a token names a key not seen yet: keys rotate), `iss`, `aud` (and `azp`), `exp`,
`iat` and `nbf` within the allowed clock skew, and the nonce of this sign-in. Then the
(issuer, subject) pair finds the account, or a verified email links or creates one.
"""

from __future__ import annotations

import base64
import hmac
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
from authlib.integrations.httpx_client import OAuth2Client
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.accounts import tokens
from app.accounts.models import OidcIdentity, OidcLogin, Role, User, UserStatus
from app.accounts.service import IssuedToken, create_user, normalize_email, start_session
from app.audit import service as audit
from app.audit.service import SYSTEM, Actor
from app.db import begin_writing, utcnow
from app.settings import Settings
from app.unit_of_work import commit_before_raising, commit_before_waiting

# asymmetric only: `none` forges anything, and an HMAC "signed" with the client secret
# (or with a public key read as one) proves nothing about the provider
ALLOWED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_STATE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_CODE = re.compile(r"[\x21-\x7e]{1,2048}")  # printable ASCII, no spaces
DISCOVERY_TTL_S = 3600.0


class SignInRefused(Exception):
    """A single sign-on that cannot go on: `reason` for the audit trail, `message` for people."""

    def __init__(self, reason: str, message: str, status: int = 401) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message = message
        self.status = status


@dataclass(frozen=True)
class ProviderMetadata:
    """What discovery says about the provider."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


@dataclass
class _Provider:
    metadata: ProviderMetadata
    fetched_at: float
    keys: KeySet | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_providers: dict[str, _Provider] = {}
_providers_lock = threading.Lock()


def enabled(settings: Settings) -> bool:
    """Whether single sign-on is configured."""
    return bool(settings.oidc_issuer and settings.oidc_client_id)


def redirect_uri(settings: Settings) -> str:
    """Where the provider sends the browser back (register it with the provider)."""
    return f"{settings.public_url.rstrip('/')}/api/v1/auth/oidc/callback"


def _get_json(url: str, settings: Settings) -> dict[str, Any]:
    answer = httpx.get(url, timeout=settings.oidc_http_timeout_s, follow_redirects=False)
    answer.raise_for_status()
    body = answer.json()
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


def _provider(settings: Settings) -> _Provider:
    issuer = settings.oidc_issuer.rstrip("/")
    with _providers_lock:
        known = _providers.get(issuer)
        if known is not None and time.monotonic() - known.fetched_at < DISCOVERY_TTL_S:
            return known
    try:
        doc = _get_json(f"{issuer}/.well-known/openid-configuration", settings)
        metadata = ProviderMetadata(
            issuer=str(doc["issuer"]),
            authorization_endpoint=str(doc["authorization_endpoint"]),
            token_endpoint=str(doc["token_endpoint"]),
            jwks_uri=str(doc["jwks_uri"]),
        )
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise SignInRefused(
            "discovery", "the identity provider cannot be reached; try again later", 502
        ) from exc
    # OpenID Connect Discovery 1.0, section 4.3: the document speaks for this issuer only
    if metadata.issuer.rstrip("/") != issuer:
        raise SignInRefused("discovery", "the identity provider is misconfigured", 502)
    provider = _Provider(metadata=metadata, fetched_at=time.monotonic())
    with _providers_lock:
        _providers[issuer] = provider
    return provider


def _keys(provider: _Provider, settings: Settings, *, refresh: bool) -> KeySet:
    with provider.lock:
        if provider.keys is None or refresh:
            try:
                provider.keys = KeySet.import_key_set(
                    _get_json(provider.metadata.jwks_uri, settings)  # type: ignore[arg-type]
                )
            except (httpx.HTTPError, ValueError, JoseError) as exc:
                raise SignInRefused(
                    "jwks", "the identity provider's keys cannot be read; try again later", 502
                ) from exc
        return provider.keys


def _b64json(segment: str) -> dict[str, Any]:
    padded = segment + "=" * (-len(segment) % 4)
    value = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def token_header(id_token: str, *, max_bytes: int) -> dict[str, Any]:
    """The JOSE header of a compact JWS, after the checks that need no key; SignInRefused."""
    if len(id_token) > max_bytes:
        raise SignInRefused("oversized", "the identity provider's answer is too large")
    parts = id_token.split(".")
    if len(parts) != 3 or not all(parts[:2]):
        raise SignInRefused("malformed", "the identity provider's answer is malformed")
    try:
        header = _b64json(parts[0])
    except (ValueError, UnicodeError):
        raise SignInRefused("malformed", "the identity provider's answer is malformed") from None
    if header.get("alg") not in ALLOWED_ALGORITHMS:
        raise SignInRefused("algorithm", "the identity provider's answer is not signed acceptably")
    if "crit" in header or "jku" in header or "jwk" in header or "x5u" in header:
        # keys come from the provider's JWKS alone, never from the token itself
        raise SignInRefused("algorithm", "the identity provider's answer is not signed acceptably")
    return header


def verify_id_token(
    id_token: str,
    *,
    keys: Any,
    issuer: str,
    client_id: str,
    nonce: str,
    now: float,
    settings: Settings,
) -> dict[str, Any]:
    """The claims of an ID token that passes every check; SignInRefused naming the first failure.

    `keys(refresh)` gives the provider's key set; a token whose `kid` is not in it gets one
    fresh fetch (the provider rotated its keys) before it is refused.
    """
    header = token_header(id_token, max_bytes=settings.oidc_max_id_token_bytes)
    key_set: KeySet = keys(False)
    kid = header.get("kid")
    if kid is not None and not any(k.kid == kid for k in key_set.keys):
        key_set = keys(True)
    try:
        decoded = jwt.decode(id_token, key_set, algorithms=sorted(ALLOWED_ALGORITHMS))
    except (JoseError, ValueError) as exc:
        raise SignInRefused(
            "signature", "the identity provider's signature does not verify"
        ) from exc
    claims = dict(decoded.claims)
    skew = settings.oidc_clock_skew_s
    if claims.get("iss") != issuer:
        raise SignInRefused("issuer", "the sign-in came from another identity provider")
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience
    if not isinstance(audiences, list) or client_id not in audiences:
        raise SignInRefused("audience", "the sign-in was meant for another application")
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise SignInRefused("audience", "the sign-in was meant for another application")
    for name in ("exp", "iat"):
        if not isinstance(claims.get(name), int | float) or isinstance(claims.get(name), bool):
            raise SignInRefused("malformed", "the identity provider's answer is malformed")
    if claims["exp"] <= now - skew:
        raise SignInRefused("expired", "the sign-in expired; try again")
    if claims["iat"] > now + skew or claims.get("nbf", 0) > now + skew:
        raise SignInRefused("not_yet_valid", "the sign-in is not valid yet; check the clocks")
    claimed_nonce = claims.get("nonce")
    if not isinstance(claimed_nonce, str) or not hmac.compare_digest(claimed_nonce, nonce):
        raise SignInRefused("nonce", "the sign-in does not belong to this attempt; try again")
    if not isinstance(claims.get("sub"), str) or not claims["sub"] or len(claims["sub"]) > 255:
        raise SignInRefused("malformed", "the identity provider's answer is malformed")
    return claims


def begin(db: Session, *, settings: Settings) -> tuple[str, str]:
    """Start a sign-in: the provider's URL to send the browser to, and the state for its cookie."""
    provider = _provider(settings)
    state = secrets.token_urlsafe(32)
    nonce = secrets.token_urlsafe(32)
    verifier = secrets.token_urlsafe(64)
    begin_writing(db)
    db.execute(delete(OidcLogin).where(OidcLogin.expires_at < utcnow()))
    db.add(
        OidcLogin(
            state_hash=tokens.token_hash(state),
            nonce=nonce,
            code_verifier=verifier,
            expires_at=utcnow() + timedelta(minutes=settings.oidc_login_minutes),
        )
    )
    query = {
        "response_type": "code",
        "client_id": settings.oidc_client_id,
        "redirect_uri": redirect_uri(settings),
        "scope": settings.oidc_scopes,
        "state": state,
        "nonce": nonce,
        "code_challenge": create_s256_code_challenge(verifier),
        "code_challenge_method": "S256",
    }
    return f"{provider.metadata.authorization_endpoint}?{urlencode(query)}", state


def _exchange(code: str, verifier: str, provider: _Provider, settings: Settings) -> str:
    secret = settings.oidc_client_secret
    client = OAuth2Client(
        client_id=settings.oidc_client_id,
        client_secret=secret.get_secret_value() if secret else None,
        token_endpoint_auth_method="client_secret_basic" if secret else "none",
        redirect_uri=redirect_uri(settings),
        timeout=settings.oidc_http_timeout_s,
    )
    try:
        with client:
            token = client.fetch_token(
                provider.metadata.token_endpoint,
                grant_type="authorization_code",
                code=code,
                code_verifier=verifier,
            )
    except Exception as exc:  # authlib raises its own OAuthError and httpx's errors alike
        raise SignInRefused("code", "the identity provider refused the sign-in; try again") from exc
    id_token = token.get("id_token")
    if not isinstance(id_token, str):
        raise SignInRefused("malformed", "the identity provider sent no ID token")
    return id_token


def _role_from(claims: dict[str, Any], settings: Settings) -> Role | None:
    """The role the provider's groups give, or None when no group is configured."""
    if not (settings.oidc_admin_group or settings.oidc_auditor_group):
        return None
    groups = claims.get(settings.oidc_groups_claim) or []
    if isinstance(groups, str):
        groups = [groups]
    if not isinstance(groups, list):
        groups = []
    if settings.oidc_admin_group and settings.oidc_admin_group in groups:
        return Role.admin
    if settings.oidc_auditor_group and settings.oidc_auditor_group in groups:
        return Role.auditor
    return Role.member


def _account(db: Session, claims: dict[str, Any], *, ip: str | None, settings: Settings) -> User:
    issuer, subject = claims["iss"], claims["sub"]
    linked = db.scalar(
        select(OidcIdentity).where(OidcIdentity.issuer == issuer, OidcIdentity.subject == subject)
    )
    if linked is not None:
        user = db.get(User, linked.user_id)
        assert user is not None  # the foreign key cascades
    else:
        email = claims.get("email")
        if not isinstance(email, str) or not email or len(email) > 320:
            raise SignInRefused("no_email", "the identity provider did not tell your email", 403)
        if claims.get("email_verified") is not True:
            raise SignInRefused(
                "unverified_email", "your email is not verified at the identity provider", 403
            )
        found = db.scalar(select(User).where(User.email == normalize_email(email)))
        if found is None:
            if not settings.oidc_create_users:
                raise SignInRefused(
                    "not_invited", "this platform admits invited people only; ask an admin", 403
                )
            name = claims.get("name")
            found = create_user(
                db,
                actor=SYSTEM,
                email=email,
                display_name=name[:200] if isinstance(name, str) and name else email,
                role=_role_from(claims, settings) or Role.member,
                password=None,
                settings=settings,
            )
        user = found
        linked = OidcIdentity(user_id=user.id, issuer=issuer, subject=subject)
        db.add(linked)
        db.flush()
        audit.record(
            db,
            actor=Actor(user.id, ip),
            action="user.oidc.link",
            subject=user,
            details={"provider": issuer, "subject": subject[:64]},
        )
    if user.status != UserStatus.active:
        raise SignInRefused("inactive", "this account cannot sign in", 403)
    role = _role_from(claims, settings)
    if role is not None and role != user.role:
        previous = user.role
        user.role = role
        audit.record(
            db,
            actor=SYSTEM,
            action="user.update",
            subject=user,
            details={"role": role.value, "was": previous.value, "by": "oidc groups"},
        )
    linked.last_login_at = utcnow()
    return user


def _refuse(db: Session, refusal: SignInRefused, *, ip: str | None, claims: dict[str, Any]) -> None:
    details = {"reason": refusal.reason, "provider": str(claims.get("iss", ""))[:255]}
    if claims.get("sub"):
        details["subject"] = str(claims["sub"])[:64]
    begin_writing(db)
    audit.record(
        db,
        actor=Actor(None, ip),
        action="auth.oidc",
        subject_type="oidc",
        subject_id=details.get("subject", "unknown"),
        outcome="failure",
        details=details,
    )
    commit_before_raising(db)


def finish(
    db: Session,
    *,
    state: str,
    state_cookie: str,
    code: str,
    ip: str | None,
    settings: Settings,
) -> tuple[User, IssuedToken]:
    """Complete a sign-in from the provider's answer; SignInRefused (audited) otherwise."""
    claims: dict[str, Any] = {}
    try:
        if not _STATE.fullmatch(state) or not _CODE.fullmatch(code):
            raise SignInRefused("malformed", "the sign-in answer is malformed; start again", 400)
        if not state_cookie or not hmac.compare_digest(state, state_cookie):
            raise SignInRefused(
                "state", "the sign-in did not start in this browser; start again", 400
            )
        begin_writing(db)
        login = db.scalar(select(OidcLogin).where(OidcLogin.state_hash == tokens.token_hash(state)))
        if login is None:
            raise SignInRefused("state", "this sign-in was used or never started; start again", 400)
        nonce, verifier, expires_at = login.nonce, login.code_verifier, login.expires_at
        db.delete(login)  # used once, whatever comes next
        commit_before_waiting(db)  # the provider is called holding no lock
        if expires_at <= utcnow():
            raise SignInRefused("state", "the sign-in took too long; start again", 400)
        provider = _provider(settings)
        id_token = _exchange(code, verifier, provider, settings)
        claims = verify_id_token(
            id_token,
            keys=lambda refresh: _keys(provider, settings, refresh=refresh),
            issuer=provider.metadata.issuer,
            client_id=settings.oidc_client_id,
            nonce=nonce,
            now=time.time(),
            settings=settings,
        )
        begin_writing(db)
        user = _account(db, claims, ip=ip, settings=settings)
    except SignInRefused as refusal:
        db.rollback()
        _refuse(db, refusal, ip=ip, claims=claims)
        raise
    issued = start_session(
        db,
        user=user,
        ip=ip,
        settings=settings,
        details={"via": "oidc", "provider": claims["iss"], "subject": claims["sub"][:64]},
    )
    return user, issued
