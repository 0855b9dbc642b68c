"""Typed FastAPI dependencies: the database session, the caller, roles, paging."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request
from sqlalchemy.orm import Session

from app.accounts import service as accounts
from app.accounts.models import AuthToken, Role, TokenKind, User
from app.accounts.tokens import csrf_token
from app.audit.service import Actor
from app.db import session_scope
from app.errors import Forbidden, NotAuthenticated
from app.keyring import Purpose, subkey
from app.settings import Settings

SESSION_COOKIE = "nebula_session"
CSRF_COOKIE = "nebula_csrf"
CSRF_HEADER = "X-CSRF-Token"
API_PREFIX = "/api/v1"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_settings_dep(request: Request) -> Settings:
    """The settings the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_db(request: Request) -> Iterator[Session]:
    """One session per request; services commit their own units of work."""
    yield from session_scope(request.app.state.sessionmaker)


SessionDep = Annotated[Session, Depends(get_db)]


@dataclass(frozen=True)
class Caller:
    """The authenticated user, the credential used, and how it came."""

    user: User
    token: AuthToken
    via_cookie: bool
    ip: str | None

    @property
    def actor(self) -> Actor:
        """The caller as an audit actor."""
        return Actor(user_id=self.user.id, ip=self.ip)


def client_ip(request: Request) -> str | None:
    """The peer address of the request."""
    return request.client.host if request.client else None


def get_caller(request: Request, db: SessionDep, settings: SettingsDep) -> Caller:
    """Authenticate by bearer token or session cookie (with CSRF on unsafe methods)."""
    auth = request.headers.get("authorization", "")
    via_cookie = False
    if auth.lower().startswith("bearer "):
        secret = auth[7:].strip()
    else:
        secret = request.cookies.get(SESSION_COOKIE, "")
        via_cookie = True
    if not secret:
        raise NotAuthenticated("not authenticated")
    resolved = accounts.resolve_token(db, secret=secret)
    if resolved is None:
        raise NotAuthenticated("invalid or expired token")
    user, token = resolved
    if via_cookie:
        if token.kind != TokenKind.session:
            raise NotAuthenticated("invalid or expired token")
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(sent, csrf_token(subkey(settings, Purpose.csrf), secret)):
                raise Forbidden("missing or wrong CSRF token")
    return Caller(user=user, token=token, via_cookie=via_cookie, ip=client_ip(request))


CallerDep = Annotated[Caller, Depends(get_caller)]


def require_admin(caller: CallerDep) -> Caller:
    """Admins only."""
    if caller.user.role != Role.admin:
        raise Forbidden("admin role required")
    return caller


def require_auditor(caller: CallerDep) -> Caller:
    """Admins and auditors."""
    if caller.user.role not in (Role.admin, Role.auditor):
        raise Forbidden("admin or auditor role required")
    return caller


def require_writer(caller: CallerDep) -> Caller:
    """Anyone but auditors, whose role is read-only."""
    if caller.user.role == Role.auditor:
        raise Forbidden("auditors have a read-only role")
    return caller


AdminDep = Annotated[Caller, Depends(require_admin)]
AuditorDep = Annotated[Caller, Depends(require_auditor)]
WriterDep = Annotated[Caller, Depends(require_writer)]


@dataclass(frozen=True)
class Page:
    """?limit=&offset= of a list."""

    limit: int
    offset: int


def get_page(
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> Page:
    """Paging parameters with the contract's bounds."""
    return Page(limit=limit, offset=offset)


PageDep = Annotated[Page, Depends(get_page)]
