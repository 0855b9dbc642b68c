"""`nebula serve`: uvicorn with uvloop and httptools, in one process or several.

With several worker processes the parent holds the listening socket and runs the
reaper, once; each worker serves requests only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections import Counter
from typing import Any, ClassVar

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.db import make_engine, make_sessionmaker
from app.jobs.dispatch import Reaper
from app.main import create_app
from app.settings import Settings, get_settings

log = logging.getLogger("nebula")


def set_nodelay(sock: socket.socket | None) -> None:
    """Send small answers at once (no Nagle delay) on a TCP socket."""
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for request heads, a cap on connections
    per client address, and TCP_NODELAY.

    uvicorn waits for a request's head without limit (its keep-alive timer runs only between
    requests, and not before the first), so a client that trickles headers would keep its
    connection for ever. Each head must be complete within `head_timeout_s` of its first byte
    (of the connection, for the first one); a connection past its address's cap is answered
    503 and closed at once. The counts are per process: one event loop serves them all.

    With several workers uvicorn binds the socket itself (protocol number 0), and asyncio
    then leaves TCP_NODELAY off on accepted sockets: each keep-alive answer waits for
    the client's delayed ACK.
    """

    head_timeout_s: ClassVar[float] = 10.0
    max_connections_per_address: ClassVar[int] = 64
    _open: ClassVar[Counter[str]] = Counter()

    _head_timer: asyncio.TimerHandle | None = None
    _counted: str | None = None

    @classmethod
    def configure(cls, settings: Settings) -> None:
        """Take the deadline and the cap from `settings` (before serving)."""
        cls.head_timeout_s = settings.request_head_timeout_s
        cls.max_connections_per_address = settings.max_connections_per_address

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport.get_extra_info("socket"))
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None and self.max_connections_per_address > 0:
            if self._open[address] >= self.max_connections_per_address:
                transport.write(_REFUSED)
                transport.close()
                return
            self._open[address] += 1
            self._counted = address
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._counted is not None:
            self._open[self._counted] -= 1
            if self._open[self._counted] <= 0:
                del self._open[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_HEAD_TIMED_OUT)
        self.transport.close()


def _plain_answer(status: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_REFUSED = _plain_answer("503 Service Unavailable", "too many connections from this address")
_HEAD_TIMED_OUT = _plain_answer("408 Request Timeout", "the request head did not arrive in time")

PROTOCOL = f"{__name__}:{GuardedHttpToolsProtocol.__name__}"


def worker_app() -> FastAPI:
    """The app of one of several worker processes: the parent runs the reaper."""
    settings = get_settings()
    GuardedHttpToolsProtocol.configure(settings)
    return create_app(settings.model_copy(update={"run_reaper": False}))


def serve(
    settings: Settings, *, host: str, port: int, workers: int, tls: tuple[str, str] | None = None
) -> int:
    """Serve the API and web UI until interrupted; HTTPS with `tls` (certificate, key)."""
    GuardedHttpToolsProtocol.configure(settings)
    common: dict[str, Any] = {"host": host, "port": port, "loop": "uvloop", "http": PROTOCOL}
    if tls is not None:
        common.update(ssl_certfile=tls[0], ssl_keyfile=tls[1])
        settings = settings.model_copy(update={"cookie_secure": True})
        # the workers read their settings from the environment, as this process did
        os.environ["NEBULA_COOKIE_SECURE"] = "true"
    if workers <= 1:
        uvicorn.run(create_app(settings), log_level="info", **common)
        return 0
    reaper = None
    engine = make_engine(settings.resolved_database_url)
    if settings.run_reaper:
        reaper = Reaper(make_sessionmaker(engine), settings).start()
        log.info("reaper running in the parent process, for %d workers", workers)
    try:
        uvicorn.run(
            f"{__name__}:{worker_app.__name__}",
            factory=True,
            workers=workers,
            log_level="info",
            **common,
        )
    finally:
        if reaper is not None:
            reaper.stop()
        engine.dispose()
    return 0
