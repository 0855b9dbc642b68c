"""The credential check a signed-in route's request passes before it takes an admission slot.

Without it a request with a missing, forged or revoked token waits for a slot like any other
and is refused inside it: a client sending bad tokens as fast as it can takes turns at the
slots with the tenants who are signed in. Here such a request is refused (401) before it
takes one. No credential at all costs nothing to refuse; a credential this process saw
live lately (`remember_s`) goes straight on; any other is looked up on threads of its own
(`threads`, each with its own database connection), so that bad tokens queue behind each
other and never in front of a signed-in tenant's request.

This is only the door. The endpoint still resolves the credential in its own hop
(app/deps.py `Caller.resolve`): the remembered set decides which queue a request joins,
never what it may do, so a token revoked a moment ago is refused at once, and forgotten
here by that refusal.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable

import anyio
from starlette.requests import cookie_parser
from starlette.types import Scope

from app.route_table import RouteTable

NO_CREDENTIAL = "not authenticated"
DEAD_CREDENTIAL = "invalid or expired token"


def presented_secret(scope: Scope, cookie_name: str) -> str:
    """The bearer token, else the session cookie, as app/deps.py `get_caller` reads them."""
    authorization = b""
    cookie_header = b""
    for name, value in scope["headers"]:
        if name == b"authorization" and not authorization:
            authorization = value
        elif name == b"cookie" and not cookie_header:
            cookie_header = value
    auth = authorization.decode("latin-1")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return cookie_parser(cookie_header.decode("latin-1")).get(cookie_name, "")


class CredentialGate:
    """Refuse a signed-in route's request with a dead credential before it takes a slot."""

    def __init__(
        self,
        *,
        routes: Callable[[], RouteTable],
        is_live: Callable[[str], bool],
        cookie_name: str,
        threads: int,
        remember_s: float = 60.0,
        capacity: int = 4096,
    ) -> None:
        self._routes_of = routes
        self._routes: RouteTable | None = None
        self._is_live = is_live
        self.cookie_name = cookie_name
        self._threads = threads
        self._limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter]
        self._limiters = weakref.WeakKeyDictionary()
        self.remember_s = remember_s
        self.capacity = capacity
        # sha256 of a secret seen live -> when that stops counting (monotonic); oldest first
        self._live: OrderedDict[str, float] = OrderedDict()

    def signs_in(self, method: str, path: str) -> bool:
        """Whether the route at `path` answers only a signed-in caller."""
        if self._routes is None:
            self._routes = self._routes_of()
        return self._routes.offers(method, path)

    def _limiter(self) -> anyio.CapacityLimiter:
        # one per event loop (a test client may serve the same app from several loops)
        key = asyncio.get_running_loop()
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = anyio.CapacityLimiter(self._threads)
        return limiter

    def _remembered(self, digest: str) -> bool:
        until = self._live.get(digest)
        if until is None:
            return False
        if until < time.monotonic():
            del self._live[digest]
            return False
        self._live.move_to_end(digest)
        return True

    def _remember(self, digest: str) -> None:
        self._live[digest] = time.monotonic() + self.remember_s
        self._live.move_to_end(digest)
        while len(self._live) > self.capacity:
            self._live.popitem(last=False)

    def forget(self, digest: str) -> None:
        """The endpoint refused this credential (401): it no longer goes straight on."""
        self._live.pop(digest, None)

    async def refusal(self, scope: Scope) -> tuple[str | None, str]:
        """(401's detail or None, the credential's digest) for a request about to take a slot.

        A credential remembered live goes on before the route is even looked at: the common
        case costs a header scan, a sha256 and a dict lookup (the route look-up is left to the
        requests that need it).
        """
        secret = presented_secret(scope, self.cookie_name)
        digest = hashlib.sha256(secret.encode()).hexdigest() if secret else ""
        if digest and self._remembered(digest):
            return None, digest
        if not self.signs_in(scope["method"], scope["path"]):
            return None, ""
        if not secret:
            return NO_CREDENTIAL, ""
        live = await anyio.to_thread.run_sync(self._is_live, secret, limiter=self._limiter())
        if not live:
            return DEAD_CREDENTIAL, digest
        self._remember(digest)
        return None, digest
