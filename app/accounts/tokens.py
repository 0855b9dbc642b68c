"""Opaque bearer tokens: random secrets shown once, stored as sha256."""

from __future__ import annotations

import hashlib
import hmac
import secrets

SESSION_PREFIX = "nbs_"
API_PREFIX = "nbt_"


def new_secret(prefix: str) -> str:
    """A fresh token with 256 bits of entropy; the prefix tells its kind at a glance."""
    return prefix + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the database stores of a token (high-entropy secrets need no slow hash)."""
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_token(secret: bytes, session_token: str) -> str:
    """The CSRF value bound to a session: derivable by the server, unguessable by others."""
    return hmac.new(secret, b"csrf:" + session_token.encode(), hashlib.sha256).hexdigest()
