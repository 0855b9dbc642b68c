"""How errors answer over HTTP: one body shape for every error, and the handlers that write it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError
from starlette.concurrency import run_in_threadpool

from app.db import begin_writing
from app.errors import DomainError
from app.routing import InHop
from app.seals import TamperedRow

log = logging.getLogger("nebula")


class FieldError(BaseModel):
    """One rejected part of a request (validation only)."""

    loc: list[str | int] = Field(description='Where: e.g. ["body", "email"] or ["query", "limit"]')
    msg: str
    type: str = Field(description="A stable machine-readable code, e.g. string_too_short")


class ErrorOut(BaseModel):
    """The body of every error answer."""

    detail: str = Field(description="One readable sentence")
    errors: list[FieldError] = Field(
        default_factory=list, description="Validation errors only: every rejected field"
    )


# Each error status of this API: its shared response's name in the document, and what it means.
ERROR_RESPONSES: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "Bad request: not acceptable as sent (e.g. a NUL byte in the URL)"),
    401: (
        "NotAuthenticated",
        "Not authenticated: no credentials, or an invalid, expired or revoked token",
    ),
    403: (
        "Forbidden",
        "Authenticated, but the role or a grant does not allow it (or the CSRF header is missing)",
    ),
    404: ("NotFound", "Not found, or belongs to another tenant (never revealed which)"),
    408: ("RequestTimeout", "The request body did not arrive in time; the connection is closed"),
    409: ("Conflict", "Conflicts with the current state"),
    413: ("TooLarge", "Too large: the request body or a quota"),
    422: (
        "Invalid",
        "Invalid input: a field the schema describes (listed in `errors`) or a rule it cannot",
    ),
    429: (
        "TooManyAttempts",
        "Too many attempts (or refused requests from this user or address); try again later",
    ),
    507: ("InsufficientStorage", "The server's storage is full; nothing was stored"),
}


def _where(loc: Sequence[Any]) -> str:
    # "body" alone is the whole body; otherwise the field path reads better without it
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts)


def validation_body(errors: list[Any]) -> dict[str, Any]:
    """The error body for FastAPI's validation errors: a sentence and the fields."""
    # The offending input is left out on purpose: it may be a password.
    fields = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
        for e in errors
    ]
    detail = "; ".join(f"{_where(f['loc'])}: {f['msg']}" for f in fields) or "invalid request"
    return {"detail": detail, "errors": jsonable_encoder(fields)}


def install_error_handlers(app: FastAPI) -> None:
    """Map domain errors, validation errors and the unexpected to the one error body."""

    @app.exception_handler(DomainError)
    async def domain_error(_request: Request, exc: DomainError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(TamperedRow)
    async def tampered(request: Request, exc: TamperedRow) -> JSONResponse:
        # refused as missing; the attempt is committed to the audit log on its own
        await run_in_threadpool(_audit_tampering, request, exc)
        return await domain_error(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # a caller the endpoint would have refused is refused first (401 or 403, not 422)
        caller = getattr(request.state, "caller", None)
        if isinstance(caller, InHop):
            try:
                await run_in_threadpool(caller.resolve_apart)
            except DomainError as refusal:
                return await domain_error(request, refusal)
        return JSONResponse(validation_body(list(exc.errors())), status_code=422)

    @app.exception_handler(DataError)
    async def unstorable(_request: Request, _exc: DataError) -> JSONResponse:
        # e.g. a NUL byte, which PostgreSQL text cannot hold; the transaction is rolled back
        return JSONResponse(
            {"detail": "the input holds characters or values that cannot be stored"},
            status_code=422,
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal error"}, status_code=500)


def _audit_tampering(request: Request, exc: TamperedRow) -> None:
    """Record a row whose seal failed, as `integrity.tampered`, in a transaction of its own."""
    from app.audit.service import Actor, record

    log.error("refused a %s row whose seal does not hold: %s", exc.table, exc.row_id)
    ip = request.client.host if request.client else None
    with request.app.state.sessionmaker() as db:
        begin_writing(db)
        record(
            db,
            actor=Actor(user_id=None, ip=ip),
            action="integrity.tampered",
            subject_type=exc.table,
            subject_id=exc.row_id,
            outcome="denied",
            details={"table": exc.table, "path": request.url.path, "status": 404},
        )
        db.commit()
