"""Typed FastAPI dependencies: the database session, the caller, roles, paging."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Query, Request
from sqlalchemy.orm import Session

from app.accounts import service as accounts
from app.accounts.models import AuthToken, Identity, Role, TokenKind, User, UserStatus
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


# Dependencies that do no I/O are coroutines: FastAPI runs a plain function on the thread
# pool, a hop (and a wait for a free thread) that costs more than the work itself.


async def get_settings_dep(request: Request) -> Settings:
    """The settings the app was built with."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_db(request: Request) -> AsyncIterator[Session]:
    """One session per request; the route commits its unit of work (app/__init__.py).

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
    """The authenticated caller, the credential used, and how it came.

    Authentication reads who is calling (`identity`); the user's and the token's rows load
    from the request's session the first time an endpoint asks for them, and a user no
    longer active by then is refused.
    """

    identity: Identity
    via_cookie: bool
    ip: str | None
    db: Session = field(repr=False, compare=False)

    @property
    def user_id(self) -> str:
        """The caller's user id."""
        return self.identity.id

    @property
    def role(self) -> Role:
        """The caller's role."""
        return self.identity.role

    @cached_property
    def user(self) -> User:
        """The caller's user row, attached to the request's session."""
        user = self.db.get(User, self.identity.id)
        if user is None or user.status != UserStatus.active:
            raise NotAuthenticated("invalid or expired token")
        return user

    @cached_property
    def token(self) -> AuthToken:
        """The credential's row, attached to the request's session."""
        token = self.db.get(AuthToken, self.identity.token_id)
        if token is None:
            raise NotAuthenticated("invalid or expired token")
        return token

    @property
    def actor(self) -> Actor:
        """The caller as an audit actor."""
        return Actor(user_id=self.identity.id, ip=self.ip)


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
    identity = accounts.resolve_token(db, secret=secret)
    if writes:
        db.commit()  # the endpoint's transaction may write
    if identity is None:
        raise NotAuthenticated("invalid or expired token")
    if via_cookie:
        if identity.token_kind != TokenKind.session:
            raise NotAuthenticated("invalid or expired token")
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(sent, csrf_token(subkey(settings, Purpose.csrf), secret)):
                raise Forbidden("missing or wrong CSRF token")
    return Caller(identity=identity, via_cookie=via_cookie, ip=client_ip(request), db=db)


CallerDep = Annotated[Caller, Depends(get_caller)]


@raises(Forbidden)
async def require_admin(caller: CallerDep) -> Caller:
    """Admins only."""
    if caller.role != Role.admin:
        raise Forbidden("admin role required")
    return caller


@raises(Forbidden)
async def require_auditor(caller: CallerDep) -> Caller:
    """Admins and auditors."""
    if caller.role not in (Role.admin, Role.auditor):
        raise Forbidden("admin or auditor role required")
    return caller


@raises(Forbidden)
async def require_writer(caller: CallerDep) -> Caller:
    """Anyone but auditors, whose role is read-only."""
    if caller.role == Role.auditor:
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


async def get_page(
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> Page:
    """Paging parameters with the contract's bounds."""
    return Page(limit=limit, offset=offset)


PageDep = Annotated[Page, Depends(get_page)]
