"""`nebula serve`: uvicorn with uvloop and httptools, in one process or several.

With several worker processes the parent holds the listening socket and runs the
reaper, once; each worker serves requests only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

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


class NoDelayHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on sockets with TCP_NODELAY.

    With several workers uvicorn binds the socket itself (protocol number 0), and asyncio
    then leaves TCP_NODELAY off on accepted sockets: each keep-alive answer waits for
    the client's delayed ACK.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport.get_extra_info("socket"))
        super().connection_made(transport)


PROTOCOL = f"{__name__}:{NoDelayHttpToolsProtocol.__name__}"


def worker_app() -> FastAPI:
    """The app of one of several worker processes: the parent runs the reaper."""
    return create_app(get_settings().model_copy(update={"run_reaper": False}))


def serve(
    settings: Settings, *, host: str, port: int, workers: int, tls: tuple[str, str] | None = None
) -> int:
    """Serve the API and web UI until interrupted; HTTPS with `tls` (certificate, key)."""
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
