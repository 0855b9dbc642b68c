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
from app.accounts.models import (
    AuthToken,
    Identity,
    Role,
    TokenKind,
    TokenScope,
    User,
    UserStatus,
)
from app.accounts.tokens import csrf_token
from app.audit.service import Actor
from app.db import Page, begin_reading
from app.errors import Forbidden, NotAuthenticated, raises
from app.keyring import Purpose, subkey
from app.openapi.marks import second_factor_gate, security
from app.routing import InHop
from app.settings import Settings
from contract import API_PREFIX as API_PREFIX

SESSION_COOKIE = "nebula_session"
CSRF_COOKIE = "nebula_csrf"
CSRF_HEADER = "X-CSRF-Token"
CLUSTER_API_PREFIX = f"{API_PREFIX}/cluster/"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ENROL_FIRST = "enrol a second factor first: this platform requires one for admins"


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
class Credential:
    """What a request presented: a secret, how it came, and its CSRF header if any."""

    secret: str = field(repr=False)
    via_cookie: bool
    unsafe: bool  # the method may change state (POST, PATCH, DELETE...)
    csrf_sent: str = field(default="", repr=False)


@dataclass(frozen=True)
class Demand:
    """A role condition on the caller, checked once the caller is known."""

    allowed: frozenset[Role]
    refusal: str


class Caller(InHop):
    """The authenticated caller, the credential used, and how it came.

    Who is calling is looked up in the endpoint's own hop to the thread pool (OneHopRoute
    calls `resolve` before the endpoint runs), not in a hop of its own: one trip to the
    thread pool per request, not two. Until then nothing about the caller can be read:
    a Caller that was never resolved answers no question, so a route that skipped the
    lookup fails closed. The user's and the token's rows load from the request's session
    the first time an endpoint asks for them, and a user no longer active by then is
    refused.
    """

    def __init__(
        self, credential: Credential, *, ip: str | None, db: Session, settings: Settings
    ) -> None:
        self._credential = credential
        self._demands: list[Demand] = []
        self._enrolling_allowed = False
        self._identity: Identity | None = None
        self.ip = ip
        self.db = db
        self._settings = settings

    def __repr__(self) -> str:
        return f"Caller(identity={self._identity!r}, ip={self.ip!r})"

    def demand(self, allowed: frozenset[Role], refusal: str) -> Caller:
        """Refuse the caller with 403 `refusal` unless their role is one of `allowed`."""
        self._demands.append(Demand(allowed, refusal))
        return self

    def allow_enrolling(self) -> Caller:
        """Accept a credential limited to enrolling a second factor (refused elsewhere)."""
        self._enrolling_allowed = True
        return self

    def resolve(self) -> None:
        """Look the credential up (blocking): 401 unless it is live, 403 unless the role fits."""
        if self._identity is not None:
            return
        db = self.db
        credential = self._credential
        if credential.unsafe:
            begin_reading(db)  # the write lock is taken by the endpoint, not by this lookup
        identity = accounts.resolve_token(db, secret=credential.secret)
        if credential.unsafe:
            db.commit()  # the endpoint's transaction may write
        if identity is None:
            raise NotAuthenticated("invalid or expired token")
        if credential.via_cookie:
            if identity.token_kind != TokenKind.session:
                raise NotAuthenticated("invalid or expired token")
            if credential.unsafe:
                expected = csrf_token(subkey(self._settings, Purpose.csrf), credential.secret)
                if not hmac.compare_digest(credential.csrf_sent, expected):
                    raise Forbidden("missing or wrong CSRF token")
        for demand in self._demands:
            if identity.role not in demand.allowed:
                raise Forbidden(demand.refusal)
        if identity.scope != TokenScope.full and not self._enrolling_allowed:
            raise Forbidden(ENROL_FIRST)
        self._identity = identity

    def resolve_apart(self) -> None:
        """Resolve after the request's session closed (the endpoint never ran), then close it."""
        if self._identity is not None:
            return
        try:
            self.resolve()
        finally:
            self.db.close()

    @property
    def identity(self) -> Identity:
        """Who is calling; only once `resolve` has accepted the credential."""
        if self._identity is None:
            raise RuntimeError("the caller was read before its credential was resolved")
        return self._identity

    @property
    def via_cookie(self) -> bool:
        """Whether the credential came as the session cookie."""
        return self._credential.via_cookie

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
@second_factor_gate(refuses=True)
async def get_caller(request: Request, db: SessionDep, settings: SettingsDep) -> Caller:
    """Authenticate by bearer token or session cookie (with CSRF on unsafe methods).

    No credential at all is refused here; a presented one is looked up in the endpoint's
    hop (`Caller.resolve`).
    """
    auth = request.headers.get("authorization", "")
    via_cookie = False
    if auth.lower().startswith("bearer "):
        secret = auth[7:].strip()
    else:
        secret = request.cookies.get(SESSION_COOKIE, "")
        via_cookie = True
    if not secret:
        raise NotAuthenticated("not authenticated")
    credential = Credential(
        secret=secret,
        via_cookie=via_cookie,
        unsafe=request.method not in SAFE_METHODS,
        csrf_sent=request.headers.get(CSRF_HEADER, ""),
    )
    caller = Caller(credential, ip=client_ip(request), db=db, settings=settings)
    request.state.caller = caller  # for an answer given before the endpoint runs (api_errors)
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]


@second_factor_gate(refuses=False)
async def allow_enrolling(caller: CallerDep) -> Caller:
    """Any signed-in caller, including a session that may only enrol a second factor."""
    return caller.allow_enrolling()


EnrollingCallerDep = Annotated[Caller, Depends(allow_enrolling)]

ADMIN = frozenset({Role.admin})
READERS_OF_AUDIT = frozenset({Role.admin, Role.auditor})
WRITERS = frozenset(set(Role) - {Role.auditor})


@raises(Forbidden)
async def require_admin(caller: CallerDep) -> Caller:
    """Admins only."""
    return caller.demand(ADMIN, "admin role required")


@raises(Forbidden)
async def require_auditor(caller: CallerDep) -> Caller:
    """Admins and auditors."""
    return caller.demand(READERS_OF_AUDIT, "admin or auditor role required")


@raises(Forbidden)
async def require_writer(caller: CallerDep) -> Caller:
    """Anyone but auditors, whose role is read-only."""
    return caller.demand(WRITERS, "auditors have a read-only role")


AdminDep = Annotated[Caller, Depends(require_admin)]
AuditorDep = Annotated[Caller, Depends(require_auditor)]
WriterDep = Annotated[Caller, Depends(require_writer)]


async def get_page(
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> Page:
    """Paging parameters with the contract's bounds."""
    return Page(limit=limit, offset=offset)


PageDep = Annotated[Page, Depends(get_page)]
