"""Request and response bodies of the accounts API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.accounts.models import Role, UserStatus
from app.fields import Email, NewPassword, StrictIn, example


class LoginIn(StrictIn):
    model_config = example(email="ada@example.org", password="violet-harbor-cinnamon-42")

    email: Email
    password: str = Field(min_length=1, max_length=1024, json_schema_extra={"format": "password"})
    otp: str | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="a TOTP code, or a recovery code, when the account has a second factor",
    )


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    email: str
    display_name: str
    role: Role
    status: UserStatus
    created_at: datetime


class LoginOut(BaseModel):
    token: str
    expires_at: datetime
    user: UserOut


class PasswordChangeIn(StrictIn):
    current_password: str = Field(
        min_length=1, max_length=1024, json_schema_extra={"format": "password"}
    )
    new_password: NewPassword


class TokenCreateIn(StrictIn):
    model_config = example(name="nightly script", expires_in_days=30)

    name: str = Field(min_length=1, max_length=100)
    expires_in_days: int = Field(default=30, ge=1, le=365)
    otp: str | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="a TOTP code, or a recovery code, when the account has a second factor",
    )


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None


class TokenCreatedOut(TokenOut):
    token: str


class TokenList(BaseModel):
    items: list[TokenOut]
    total: int


class UserCreateIn(StrictIn):
    model_config = example(
        email="grace@example.org",
        display_name="Grace",
        role="member",
        password="copper-lantern-meadow-7",
    )

    email: Email
    display_name: str = Field(min_length=1, max_length=200)
    # strict validation would want a Role object; the JSON carries its value
    role: Role = Field(default=Role.member, strict=False)
    password: NewPassword


class UserUpdateIn(StrictIn):
    display_name: str | None = Field(default=None, min_length=1, max_length=200)
    role: Role | None = Field(default=None, strict=False)


class UserQuotaIn(StrictIn):
    model_config = example(max_workspaces=20, storage_bytes_limit=10**11)

    max_workspaces: int | None = Field(default=None, ge=1, le=100_000)
    # JSON numbers are exact up to 2**53 in every client (the workspace quota's bound too)
    storage_bytes_limit: int | None = Field(default=None, ge=0, le=2**53 - 1)
    max_concurrent_jobs: int | None = Field(default=None, ge=0, le=10_000)
    # role slots the user's jobs may hold on one cluster at once (replicas count); at
    # least 1: a user allowed no slot at all is what suspending is for
    roles_per_cluster: int | None = Field(default=None, ge=1, le=10_000)


class UserQuotaOut(BaseModel):
    max_workspaces: int
    storage_bytes_limit: int
    max_concurrent_jobs: int
    roles_per_cluster: int
    workspaces: int
    storage_bytes_used: int
    active_jobs: int


class UserList(BaseModel):
    items: list[UserOut]
    total: int


class ResetLinkOut(BaseModel):
    url: str  # holds the link's secret: shown in this answer only
    expires_at: datetime


class ForgotPasswordIn(StrictIn):
    model_config = example(email="ada@example.org")

    email: Email


class ForgotPasswordOut(BaseModel):
    detail: str


class PasswordResetIn(StrictIn):
    token: str = Field(min_length=1, max_length=128, json_schema_extra={"format": "password"})
    new_password: NewPassword


class TotpEnrolIn(StrictIn):
    # a hardware token's own seed (base32, at least 128 bits); omitted: a fresh random one
    secret: str | None = Field(default=None, min_length=26, max_length=128)


class TotpEnrolOut(BaseModel):
    secret: str  # shown this once
    otpauth_uri: str
    qr_svg: str  # the otpauth URI as an inline SVG QR code


class TotpCodeIn(StrictIn):
    code: str = Field(min_length=1, max_length=32)


class TotpConfirmOut(BaseModel):
    recovery_codes: list[str]  # each works once; shown this once


class TotpStatusOut(BaseModel):
    enrolled: bool
    recovery_codes_left: int
    required: bool  # the platform requires a second factor for this account


class OidcInfoOut(BaseModel):
    enabled: bool
    provider_name: str  # as in "Sign in with <provider>"
    password_login: bool  # false where an admin requires single sign-on
