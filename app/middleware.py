"""ASGI middleware: admission, request body limits, security headers, request metrics, 405."""

from __future__ import annotations

import asyncio
import json
import re
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.credential_gate import CredentialGate
from app.ops.metrics import ADMISSIONS, HTTP_LATENCY, HTTP_REQUESTS
from app.route_table import RouteTable

# Uploads stream to disk and are bounded by their own limit and the workspace quota.
_UPLOAD_PATH = re.compile(
    r"^/api/v1/(workspaces/[^/]+/datasets|cluster/jobs/[^/]+/roles/[^/]+/artifact)/?$"
)
# Uploads whose route waits for the body on the event loop holding no database connection
# (it commits before streaming): they may give their slot back while they wait for data.
_LOOP_UPLOAD_PATH = re.compile(r"^/api/v1/workspaces/[^/]+/datasets/?$")
# The artifact PUT reads its body from a worker thread, which it holds (with its slot) while
# it waits. It counts in no address's turns: a cluster host's roles share an address, and
# their heartbeats must not wait behind its uploads. One per role and attempt, each with a
# worker credential and a live job token, authenticated before the body.
_ARTIFACT_PATH = re.compile(r"^/api/v1/cluster/jobs/[^/]+/roles/[^/]+/artifact/?$")
# Liveness and readiness: answered without a slot, never behind tenants' requests.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
]


Headers = list[tuple[bytes, bytes]]


async def _send_error(send: Send, status: int, detail: str, headers: Headers) -> None:
    """Answer with the API's error body, before (or instead of) the app."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


async def _send_413(send: Send, limit: int) -> None:
    await _send_error(send, 413, f"request body larger than {limit} bytes", SECURITY_HEADERS)


class HttpMiddleware(ABC):
    """ASGI middleware that acts on HTTP requests (`http`) and lets anything else through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    @abstractmethod
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request."""


class BodyLimitMiddleware(HttpMiddleware):
    """Refuse bodies over the limit: by Content-Length up front, or while streaming."""

    def __init__(self, app: ASGIApp, *, json_limit: int, upload_limit: int) -> None:
        super().__init__(app)
        self.json_limit = json_limit
        # multipart framing adds a little around the file itself
        self.upload_limit = upload_limit + 64 * 1024

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.upload_limit if _UPLOAD_PATH.match(scope["path"]) else self.json_limit
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await _send_413(send, limit)
                    return
        received = 0
        answered = False

        async def limited_receive() -> Message:
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Answer now and tell the app the client is gone: it stops reading.
                    answered = True
                    await _send_413(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not answered:
                await send(message)

        await self.app(scope, limited_receive, guarded_send)


class RejectNulMiddleware(HttpMiddleware):
    """A NUL byte in a URL is never meaningful here, and PostgreSQL text cannot hold one."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if b"%00" in scope.get("query_string", b"") or "\x00" in scope["path"]:
            await _send_error(send, 400, "NUL bytes are not accepted in URLs", SECURITY_HEADERS)
            return
        await self.app(scope, receive, send)


HSTS = (b"strict-transport-security", b"max-age=31536000; includeSubDomains")


class SecurityHeadersMiddleware(HttpMiddleware):
    """Add defensive headers to every response; HSTS whenever it is served over HTTPS."""

    def __init__(self, app: ASGIApp, *, always_https: bool = False) -> None:
        super().__init__(app)
        # behind a proxy that ends TLS the request arrives as http: the setting says https
        self.always_https = always_https

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        extra = [*SECURITY_HEADERS]
        if self.always_https or scope.get("scheme") == "https":
            extra.append(HSTS)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


class MetricsMiddleware(HttpMiddleware):
    """Count requests and their latency by route template (never by raw path)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            # the router records the matched route in the scope
            route = str(getattr(scope.get("route"), "path", "unmatched"))
            HTTP_REQUESTS.labels(scope["method"], route, str(status)).inc()
            HTTP_LATENCY.labels(route).observe(time.perf_counter() - started)


class IntakeMiddleware(HttpMiddleware):
    """Read a request's body whole, under a deadline, before it may wait for a slot.

    A slow client then holds a connection and a little memory (the body limit bounds it),
    never an admission slot, a thread or a database connection; past the deadline it is
    answered 408 and its connection closed. An upload streams instead (its route
    authenticates before reading it), and a pause longer than `upload_idle_timeout_s`
    ends it the same way. Probes have no body worth waiting for.
    """

    def __init__(
        self, app: ASGIApp, *, body_timeout_s: float, upload_idle_timeout_s: float
    ) -> None:
        super().__init__(app)
        self.body_timeout_s = body_timeout_s
        self.upload_idle_timeout_s = upload_idle_timeout_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
        elif _UPLOAD_PATH.match(scope["path"]):
            await self._stream(scope, receive, send)
        else:
            await self._buffer(scope, receive, send)

    async def _buffer(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        body = bytearray()
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                await _send_408(send, f"the request body did not arrive in {self.body_timeout_s} s")
                return
            if message["type"] == "http.disconnect":
                return  # gone, or already answered 413
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # a stream listens here for the client to go

        await self.app(scope, replay, send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = answered = False

        async def idle_limited_receive() -> Message:
            nonlocal answered
            if answered:
                return {"type": "http.disconnect"}
            try:
                return await asyncio.wait_for(receive(), self.upload_idle_timeout_s)
            except TimeoutError:
                answered = True
                if not started:
                    await _send_408(send, "the upload paused too long")
                return {"type": "http.disconnect"}

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if not answered:
                started = True
                await send(message)

        await self.app(scope, idle_limited_receive, guarded_send)


async def _send_408(send: Send, detail: str) -> None:
    # closed after the answer: what the client sends later would be read as a new request
    await _send_error(send, 408, detail, [(b"connection", b"close")])


Loop = asyncio.AbstractEventLoop


_UNCOUNTED = "(counted in no address's turns)"


class _Turns:
    """One event loop's admission: the slots, and each client address's turns at them."""

    def __init__(self, slots: int, per_address: int) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.per_address = per_address
        # address -> (its semaphore, requests holding or waiting for it); dropped when unused
        self._addresses: dict[str, tuple[asyncio.Semaphore, int]] = {}

    async def enter(self, address: str) -> None:
        """Wait for one of the address's turns (when capped)."""
        if self.per_address <= 0 or address is _UNCOUNTED:
            return
        semaphore, users = self._addresses.get(address, (None, 0))
        if semaphore is None:
            semaphore = asyncio.Semaphore(self.per_address)
        self._addresses[address] = (semaphore, users + 1)
        try:
            await semaphore.acquire()
        except BaseException:
            self._forget(address)
            raise

    def leave(self, address: str) -> None:
        """Give the address's turn back."""
        if self.per_address <= 0 or address is _UNCOUNTED:
            return
        self._addresses[address][0].release()
        self._forget(address)

    def _forget(self, address: str) -> None:
        semaphore, users = self._addresses[address]
        if users <= 1:
            del self._addresses[address]
        else:
            self._addresses[address] = (semaphore, users - 1)


class AdmissionMiddleware(HttpMiddleware):
    """At most `slots` requests inside the app at once; the others wait here holding nothing.

    An admitted request holds at most one database connection, and the pool keeps one for
    each slot, so no request ever waits for a connection while others wait for its thread.
    A slot is freed when the answer starts: a stream (events, downloads) holds no request
    connection, and reads with threads and connections of its own.

    A request arrives here complete (IntakeMiddleware), or as an upload whose route
    authenticates it before it reads the body and which gives its slot back while it waits
    for data. One client address holds at most `per_address` slots: its other requests wait
    their turn behind its own. Probes never wait. A request to a signed-in route passes
    `gate` first (app/credential_gate.py): one without a live credential is answered 401
    without ever taking a slot.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        slots: int,
        per_address: int = 0,
        gate: CredentialGate | None = None,
    ) -> None:
        super().__init__(app)
        self.slots = slots
        self.per_address = per_address
        self.gate = gate
        self._turns: weakref.WeakKeyDictionary[Loop, _Turns] = weakref.WeakKeyDictionary()

    def _loop_turns(self) -> _Turns:
        # one per event loop: a test client may serve the same app from several loops
        loop = asyncio.get_running_loop()
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = _Turns(self.slots, self.per_address)
        return turns

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        turns = self._loop_turns()
        client = scope.get("client")
        address = str(client[0]) if client else ""
        if _ARTIFACT_PATH.match(scope["path"]):
            address = _UNCOUNTED
        await turns.enter(address)
        in_turn = True
        digest = ""
        try:
            if self.gate is not None:
                refusal, digest = await self.gate.refusal(scope)
                if refusal is not None:
                    turns.leave(address)
                    ADMISSIONS.labels("refused_before_slot").inc()
                    await _send_error(send, 401, refusal, [])
                    return
            await turns.slots.acquire()
        except BaseException:
            turns.leave(address)
            raise
        ADMISSIONS.labels("admitted").inc()
        admitted = True
        responded = False

        def leave() -> None:
            nonlocal admitted, in_turn
            if admitted:
                admitted = False
                turns.slots.release()
            if in_turn:
                in_turn = False
                turns.leave(address)

        async def send_and_leave(message: Message) -> None:
            nonlocal responded
            if message["type"] == "http.response.start":
                responded = True
                leave()
                if digest and message["status"] == 401 and self.gate is not None:
                    self.gate.forget(digest)
            await send(message)

        async def receive_off_slot() -> Message:
            # the wait for upload data holds no slot; the work on what arrived does
            nonlocal admitted
            if admitted:
                admitted = False
                turns.slots.release()
            message = await receive()
            if not responded and in_turn:
                await turns.slots.acquire()
                admitted = True
            return message

        streams_on_loop = _LOOP_UPLOAD_PATH.match(scope["path"]) and scope["method"] == "POST"
        try:
            await self.app(scope, receive_off_slot if streams_on_loop else receive, send_and_leave)
        finally:
            leave()


class MethodNotAllowedMiddleware(HttpMiddleware):
    """405 with the full `Allow` list for a method an API path does not have.

    Starlette answers with the methods of the first route that matches the path alone, and a
    GET falls through to the web UI's catch-all (404); here every route on the path counts.
    """

    def __init__(self, app: ASGIApp, *, paths: Callable[[], RouteTable]) -> None:
        super().__init__(app)
        self.paths = paths
        self._known: RouteTable | None = None

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._known is None:
            self._known = self.paths()  # once every route is in (the app is built by then)
        allowed = self._known.methods(scope["path"])
        if allowed and scope["method"] not in allowed:
            allow = [(b"allow", ", ".join(sorted(allowed)).encode())]
            await _send_error(send, 405, f"method {scope['method']} not allowed", allow)
            return
        await self.app(scope, receive, send)
