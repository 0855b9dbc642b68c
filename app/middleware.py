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

from app.ops.metrics import HTTP_LATENCY, HTTP_REQUESTS

# Uploads stream to disk and are bounded by their own limit and the workspace quota.
_UPLOAD_PATH = re.compile(
    r"^/api/v1/(workspaces/[^/]+/datasets|cluster/jobs/[^/]+/roles/[^/]+/artifact)/?$"
)

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


Loop = asyncio.AbstractEventLoop


class AdmissionMiddleware(HttpMiddleware):
    """At most `slots` requests inside the app at once; the others wait here holding nothing.

    An admitted request holds at most one database connection, and the pool keeps one for
    each slot, so no request ever waits for a connection while others wait for its thread.
    A slot is freed when the answer starts: a stream (events, downloads) holds no request
    connection, and reads with threads and connections of its own.
    """

    def __init__(self, app: ASGIApp, *, slots: int) -> None:
        super().__init__(app)
        self.slots = slots
        self._semaphores: weakref.WeakKeyDictionary[Loop, asyncio.Semaphore]
        self._semaphores = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        # one per event loop: a test client may serve the same app from several loops
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.slots)
        return semaphore

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        semaphore = self._semaphore()
        await semaphore.acquire()
        admitted = True

        def leave() -> None:
            nonlocal admitted
            if admitted:
                admitted = False
                semaphore.release()

        async def send_and_leave(message: Message) -> None:
            if message["type"] == "http.response.start":
                leave()
            await send(message)

        try:
            await self.app(scope, receive, send_and_leave)
        finally:
            leave()


PathMethods = list[tuple[re.Pattern[str], frozenset[str]]]


def allowed_methods(paths: PathMethods, path: str) -> set[str]:
    """The methods offered on `path` (empty: no documented route has this path)."""
    allowed: set[str] = set()
    for pattern, methods in paths:
        if pattern.match(path):
            allowed |= methods
    return allowed


class MethodNotAllowedMiddleware(HttpMiddleware):
    """405 with the full `Allow` list for a method an API path does not have.

    Starlette answers with the methods of the first route that matches the path alone, and a
    GET falls through to the web UI's catch-all (404); here every route on the path counts.
    """

    def __init__(self, app: ASGIApp, *, paths: Callable[[], PathMethods]) -> None:
        super().__init__(app)
        self.paths = paths
        self._known: PathMethods | None = None

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._known is None:
            self._known = self.paths()
        allowed = allowed_methods(self._known, scope["path"])
        if allowed and scope["method"] not in allowed:
            allow = [(b"allow", ", ".join(sorted(allowed)).encode())]
            await _send_error(send, 405, f"method {scope['method']} not allowed", allow)
            return
        await self.app(scope, receive, send)
