"""Users, their credentials (sessions and API tokens) and failed logins."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, CreatedAt, NewId, utcnow


class Role(enum.StrEnum):
    """What a user may do on the platform."""

    admin = "admin"
    member = "member"
    auditor = "auditor"


class UserStatus(enum.StrEnum):
    """Where a user stands in the account life cycle."""

    active = "active"
    suspended = "suspended"
    deleted = "deleted"


class TokenKind(enum.StrEnum):
    """A session (from login) or a long-lived API token."""

    session = "session"
    api = "api"


class TokenScope(enum.StrEnum):
    """What a credential may do: everything, or only enrol a second factor (an admin
    without one where the platform requires it)."""

    full = "full"
    enrol = "enrol"


@dataclass(frozen=True)
class Identity:
    """Who a live credential speaks for: what authorization decides on, without the rows."""

    id: str  # the user's
    role: Role
    token_id: str
    token_kind: TokenKind
    scope: TokenScope = TokenScope.full


class User(Base):
    """An account."""

    __tablename__ = "users"
    audit_type: ClassVar[str] = "user"

    id: Mapped[NewId]
    email: Mapped[str] = mapped_column(String(320), unique=True)
    display_name: Mapped[str] = mapped_column(String(200))
    role: Mapped[Role]
    status: Mapped[UserStatus] = mapped_column(default=UserStatus.active)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[CreatedAt]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # per-user quotas over all the user's workspaces; None: the settings' defaults
    max_workspaces: Mapped[int | None]
    storage_bytes_limit: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent_jobs: Mapped[int | None]
    roles_per_cluster: Mapped[int | None]  # role slots held on one cluster at once


class AuthToken(Base):
    """A bearer credential; only the sha256 of the secret is stored."""

    __tablename__ = "auth_tokens"
    audit_type: ClassVar[str] = "token"

    id: Mapped[NewId]
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    kind: Mapped[TokenKind]
    name: Mapped[str] = mapped_column(String(100), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[CreatedAt]
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    scope: Mapped[TokenScope] = mapped_column(default=TokenScope.full, server_default="full")


class LoginFailure(Base):
    """A failed login for an email (known or not), for the lockout window.

    Each attempt is written before its password is checked and removed if it was right,
    so that attempts running at once cannot all pass a count taken before any failed.
    """

    __tablename__ = "login_failures"

    id: Mapped[NewId]
    email: Mapped[str] = mapped_column(String(320), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    ip: Mapped[str | None] = mapped_column(String(64), index=True)  # for the per-address limit


class PasswordReset(Base):
    """A one-time link that sets a new password; only the sha256 of its secret is stored."""

    __tablename__ = "password_resets"
    audit_type: ClassVar[str] = "password_reset"

    id: Mapped[NewId]
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    via: Mapped[str] = mapped_column(String(16))  # "admin" (shown to an admin) or "email"
    created_at: Mapped[CreatedAt]
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None]


class ResetRequest(Base):
    """A "forgot password" request (for an address known or not), for its rate limits."""

    __tablename__ = "reset_requests"

    id: Mapped[NewId]
    email: Mapped[str] = mapped_column(String(320), index=True)
    ip: Mapped[str | None] = mapped_column(String(64), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class TotpFactor(Base):
    """A user's TOTP second factor: the secret sealed under a key the database does not
    hold, a keyed digest of it (one secret, one account), and the last step used."""

    __tablename__ = "totp_factors"
    audit_type: ClassVar[str] = "totp"

    user_id: Mapped[str] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    secret_sealed: Mapped[str] = mapped_column(String(255))
    secret_digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[CreatedAt]
    confirmed_at: Mapped[datetime | None]  # None: enrolment begun, not yet proven
    last_step: Mapped[int | None] = mapped_column(BigInteger)  # a code's step is used once


class RecoveryCode(Base):
    """A single-use code that stands in for a TOTP code; kept as a keyed digest."""

    __tablename__ = "recovery_codes"

    id: Mapped[NewId]
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    code_digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[CreatedAt]
    used_at: Mapped[datetime | None]


class OidcIdentity(Base):
    """An account's identity at an OpenID provider: (issuer, subject) names one person."""

    __tablename__ = "oidc_identities"
    __table_args__ = (UniqueConstraint("issuer", "subject"),)
    audit_type: ClassVar[str] = "oidc_identity"

    id: Mapped[NewId]
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    issuer: Mapped[str] = mapped_column(String(255))
    subject: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[CreatedAt]
    last_login_at: Mapped[datetime | None]


class OidcLogin(Base):
    """A sign-in sent to the provider and not yet back: what its answer must match.

    Found by the sha256 of its `state`, used once (deleted when the browser comes back).
    """

    __tablename__ = "oidc_logins"

    id: Mapped[NewId]
    state_hash: Mapped[str] = mapped_column(String(64), unique=True)
    nonce: Mapped[str] = mapped_column(String(128))
    code_verifier: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[CreatedAt]
    expires_at: Mapped[datetime] = mapped_column(index=True)
