"""Typed FastAPI dependencies: the database session, the caller, roles, paging."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Query, Request
from sqlalchemy.orm import Session

from app.accounts import service as accounts
from app.accounts.models import AuthToken, Role, TokenKind, User
from app.accounts.tokens import csrf_token
from app.audit.service import Actor
from app.db import begin_reading
from app.errors import Forbidden, NotAuthenticated, raises
from app.keyring import Purpose, subkey
from app.openapi import security
from app.settings import Settings
from contract import API_PREFIX as API_PREFIX

SESSION_COOKIE = "nebula_session"
CSRF_COOKIE = "nebula_csrf"
CSRF_HEADER = "X-CSRF-Token"
CLUSTER_API_PREFIX = f"{API_PREFIX}/cluster/"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_settings_dep(request: Request) -> Settings:
    """The settings the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_db(request: Request) -> AsyncIterator[Session]:
    """One session per request; services commit their own units of work.

    Reads (GET, HEAD) get read-only transactions: they take no write lock and cannot
    write, except where a service says so with `begin_writing` (audited denials, downloads).
    Making a session does no I/O, so it is made here rather than on a thread.
    """
    if request.method in SAFE_METHODS and not request.url.path.startswith(CLUSTER_API_PREFIX):
        db = request.app.state.read_sessionmaker()
    else:
        # the cluster API's reads write too: each use of an input is audited when it happens
        db = request.app.state.sessionmaker()
    try:
        yield db
    finally:
        await close_session(db)


async def close_session(db: Session) -> None:
    """Close a session: whatever it did not commit is rolled back, its connection returned."""
    if db.in_transaction() and db.get_bind().dialect.name != "sqlite":
        # a round trip to the server: on a thread of its own, never a request thread's
        await anyio.to_thread.run_sync(db.close, limiter=anyio.CapacityLimiter(1))
    else:
        db.close()  # no connection, or SQLite's local rollback of a few microseconds


# Closed when the endpoint returns, before the answer is sent to a possibly slow client.
SessionDep = Annotated[Session, Depends(get_db, scope="function")]

T = TypeVar("T")
_DONE = object()


async def in_stream_thread(request: Request, work: Callable[..., T], *args: Any) -> T:
    """Run blocking `work` for an open stream on the stream threads, not the request threads.

    Streams hold no admission slot once their answer starts; their own small thread pool
    (and the connections the pool keeps for it) bounds what they use.
    """
    limiter: anyio.CapacityLimiter = request.app.state.stream_limiter
    return await anyio.to_thread.run_sync(work, *args, limiter=limiter)


async def stream_items(request: Request, items: Iterator[T]) -> AsyncIterator[T]:
    """A blocking iterator (one that reads the database) as a stream, on the stream threads."""
    while True:
        item = await in_stream_thread(request, next, items, _DONE)
        if item is _DONE:
            return
        yield item


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


@security({"bearer": []}, {"session_cookie": []})
@raises(NotAuthenticated, unsafe_only=(Forbidden,))
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
    writes = request.method not in SAFE_METHODS
    if writes:
        begin_reading(db)  # the write lock is taken by the endpoint, not by this lookup
    resolved = accounts.resolve_token(db, secret=secret)
    if writes:
        db.commit()  # what was read stays loaded; the endpoint's transaction may write
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


@raises(Forbidden)
def require_admin(caller: CallerDep) -> Caller:
    """Admins only."""
    if caller.user.role != Role.admin:
        raise Forbidden("admin role required")
    return caller


@raises(Forbidden)
def require_auditor(caller: CallerDep) -> Caller:
    """Admins and auditors."""
    if caller.user.role not in (Role.admin, Role.auditor):
        raise Forbidden("admin or auditor role required")
    return caller


@raises(Forbidden)
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
