"""Request and response bodies of the accounts API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, EmailStr, Field

from app.accounts.models import Role, UserStatus


class Strict(BaseModel):
    """Request bodies reject unknown fields."""

    model_config = ConfigDict(extra="forbid")


class LoginIn(Strict):
    email: EmailStr
    password: str = Field(min_length=1, max_length=1024)


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


class PasswordChangeIn(Strict):
    current_password: str = Field(min_length=1, max_length=1024)
    new_password: str = Field(min_length=1, max_length=1024)


class TokenCreateIn(Strict):
    name: str = Field(min_length=1, max_length=100)
    expires_in_days: int = Field(default=30, ge=1, le=365)


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


class UserCreateIn(Strict):
    email: EmailStr
    display_name: str = Field(min_length=1, max_length=200)
    role: Role = Role.member
    password: str = Field(min_length=1, max_length=1024)


class UserUpdateIn(Strict):
    display_name: str | None = Field(default=None, min_length=1, max_length=200)
    role: Role | None = None


class UserList(BaseModel):
    items: list[UserOut]
    total: int
