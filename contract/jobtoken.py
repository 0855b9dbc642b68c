"""Job tokens: Ed25519-signed claims that let one role of one job use its switch.

A token is `<base64url(claims json)>.<base64url(signature)>`. The control plane
signs it with its private key (`app.pki.ca.sign_job_token`); a switch verifies
it with the public key alone (`verify_job_token`), so a switch can check a
worker without reaching the control plane.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

TOKEN_VERSION = 1
MAX_TOKEN_CHARS = 8192


class JobTokenError(Exception):
    """The token is malformed, tampered, foreign or expired."""


@dataclass(frozen=True)
class JobClaims:
    """What a valid job token grants: one role of one job, on one cluster, until `expires_at`."""

    job_id: str
    role: str
    cluster: str
    expires_at: int
    # role -> cluster; when given, switches route by it and refuse frames from elsewhere
    placement: Mapping[str, str] = field(default_factory=dict)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise JobTokenError("token is not base64url") from exc


def sign_job_token(
    private_key: Ed25519PrivateKey,
    *,
    job_id: str,
    role: str,
    cluster: str,
    expires_at: int | float,
    placement: Mapping[str, str] | None = None,
) -> str:
    """Sign a token for `role` of `job_id` on `cluster`, valid until unix time `expires_at`."""
    claims = {
        "v": TOKEN_VERSION,
        "job": str(job_id),
        "role": role,
        "cluster": cluster,
        "exp": int(expires_at),
        "placement": dict(placement or {}),
    }
    body = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    return f"{_b64encode(body)}.{_b64encode(private_key.sign(body))}"


def load_job_token_public_key(pem: bytes) -> Ed25519PublicKey:
    """Load the control plane's Ed25519 public key from PEM."""
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise JobTokenError("job-token key is not Ed25519")
    return key


def unverified_claims(token: str) -> JobClaims:
    """Read a token's claims without checking the signature (only for choosing what to expect)."""
    return _parse_claims(_split(token)[0])


def verify_job_token(
    token: str, public_key: Ed25519PublicKey, *, now: float | None = None
) -> JobClaims:
    """Check signature and expiry of `token`; return its claims or raise JobTokenError."""
    body, signature = _split(token)
    try:
        public_key.verify(signature, body)
    except InvalidSignature:
        raise JobTokenError("bad signature (tampered or foreign token)") from None
    claims = _parse_claims(body)
    if claims.expires_at <= (time.time() if now is None else now):
        raise JobTokenError("token expired")
    return claims


def _split(token: str) -> tuple[bytes, bytes]:
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise JobTokenError("malformed token")
    body_text, signature_text = token.split(".")
    return _b64decode(body_text), _b64decode(signature_text)


def _parse_claims(body: bytes) -> JobClaims:
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JobTokenError("claims are not JSON") from exc
    if not isinstance(raw, dict) or raw.get("v") != TOKEN_VERSION:
        raise JobTokenError("unsupported token version")
    job, role, cluster, exp = raw.get("job"), raw.get("role"), raw.get("cluster"), raw.get("exp")
    placement = raw.get("placement", {})
    if not (isinstance(job, str) and isinstance(role, str) and isinstance(cluster, str)):
        raise JobTokenError("claims lack job, role or cluster")
    if not isinstance(exp, int) or isinstance(exp, bool):
        raise JobTokenError("claims lack an expiry")
    if not isinstance(placement, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in placement.items()
    ):
        raise JobTokenError("placement must map roles to clusters")
    return JobClaims(job_id=job, role=role, cluster=cluster, expires_at=exp, placement=placement)
