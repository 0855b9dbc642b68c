"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from sqlalchemy.orm import Session

from app import registry
from app.accounts import service as accounts
from app.api_errors import install_error_handlers
from app.audit.anchoring import Anchorer
from app.audit.flushing import RefusalFlusher
from app.audit.service import use_chain_key
from app.credential_gate import CredentialGate
from app.db import make_engine, make_sessionmaker
from app.deps import SESSION_COOKIE
from app.jobs.dispatch import Reaper
from app.middleware import (
    AdmissionMiddleware,
    BodyLimitMiddleware,
    IntakeMiddleware,
    MethodNotAllowedMiddleware,
    MetricsMiddleware,
    RejectNulMiddleware,
    SecurityHeadersMiddleware,
)
from app.openapi.document import install_document, route_methods, signed_in_routes
from app.pki.service import ensure_platform_keys
from app.settings import Settings, get_settings
from common.broker import broker_check

# the web UI: inside the installed package (a wheel built with it: setup.py copies
# frontend/dist to app/static), else the source tree's build (a checkout, `make frontend`)
PACKAGED_UI = Path(__file__).resolve().parent / "static"
FRONTEND_DIST = (
    PACKAGED_UI
    if (PACKAGED_UI / "index.html").is_file()
    else Path(__file__).resolve().parent.parent / "frontend" / "dist"
)
API_DESCRIPTION = """Train models across remote clusters joined by slow, untrusted links.

Authenticate with `Authorization: Bearer <token>` (a session token from POST /api/v1/auth/login,
or an API token from POST /api/v1/me/tokens). Every error answers `{"detail": "a sentence"}`;
a validation error (422) adds `errors`, one `{loc, msg, type}` per rejected field. Every
operation lists each status it can answer. Ids are lower-case UUIDs, date-times RFC 3339 with
an offset. Roles of a job speak to `/api/v1/cluster/...` with their cluster's worker credential
and their job token.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the control plane for `settings` (default: from the environment)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the pool has a connection for each of these threads (Settings.database_pool_size)
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.thread_pool_size
        app.state.stream_limiter = anyio.CapacityLimiter(settings.stream_threads)
        # /readyz checks on a thread of its own: it never waits behind tenants' requests
        app.state.probe_limiter = anyio.CapacityLimiter(1)
        # first, so that the first anchor of an upgraded deployment pins its unkeyed events;
        # it only reads the table, so it never queues behind (or before) the writers
        anchorer = Anchorer(app.state.read_sessionmaker, settings).start()
        ensure_platform_keys(app.state.sessionmaker, settings)
        reaper = Reaper(app.state.sessionmaker, settings).start() if settings.run_reaper else None
        flusher = RefusalFlusher(app.state.sessionmaker).start()
        try:
            yield
        finally:
            if reaper is not None:
                reaper.stop()
            flusher.stop()  # before the last anchor, which then covers its rows
            anchorer.stop()

    app = FastAPI(
        lifespan=lifespan,
        title="Nebula",
        version="0.1.0",
        description=API_DESCRIPTION,
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = use_chain_key(
        make_engine(settings.resolved_database_url, pool_size=settings.database_pool_size),
        settings,
    )
    app.state.sessionmaker = make_sessionmaker(app.state.engine)
    app.state.read_sessionmaker = make_sessionmaker(app.state.engine, writes=False)
    app.state.broker_check = lambda: broker_check(settings.broker_url, settings.var_dir)

    for router in registry.routers():
        app.include_router(router)

    install_error_handlers(app)
    install_document(app)
    _mount_frontend(app)

    app.add_middleware(
        AdmissionMiddleware,
        slots=settings.thread_pool_size,
        per_address=settings.max_requests_per_address,
        gate=CredentialGate(
            routes=lambda: signed_in_routes(app),
            is_live=lambda secret: credential_is_live(app.state.read_sessionmaker, secret),
            cookie_name=SESSION_COOKIE,
            threads=settings.credential_check_threads,
        ),
    )
    # outside admission: a slow body is read (or timed out) holding no slot
    app.add_middleware(
        IntakeMiddleware,
        body_timeout_s=settings.request_body_timeout_s,
        upload_idle_timeout_s=settings.upload_idle_timeout_s,
    )
    # outside admission: a method the path lacks is answered without taking a slot
    app.add_middleware(MethodNotAllowedMiddleware, paths=lambda: route_methods(app))
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(SecurityHeadersMiddleware, always_https=settings.cookie_secure)
    app.add_middleware(RejectNulMiddleware)
    app.add_middleware(
        BodyLimitMiddleware,
        json_limit=settings.max_request_body_bytes,
        upload_limit=settings.max_upload_bytes,
    )
    return app


def credential_is_live(sessionmaker: Callable[[], Session], secret: str) -> bool:
    """Whether `secret` is a live token of an active user (one read, its own session)."""
    with sessionmaker() as db:
        return accounts.resolve_token(db, secret=secret) is not None


def _mount_frontend(app: FastAPI) -> None:
    """Serve the built single-page app at / (any non-API path falls back to index.html)."""
    index = FRONTEND_DIST / "index.html"

    @app.get("/{path:path}", include_in_schema=False, response_model=None)
    def spa(path: str) -> FileResponse | JSONResponse:
        if path.startswith("api/"):
            return JSONResponse({"detail": "not found"}, status_code=404)
        candidate = (FRONTEND_DIST / path).resolve()
        if path and candidate.is_file() and candidate.is_relative_to(FRONTEND_DIST):
            return FileResponse(candidate)
        if index.is_file():
            return FileResponse(index)
        return JSONResponse(
            {"detail": "the web UI is not built; run `make up` or use the API at /api/docs"},
            status_code=404,
        )
