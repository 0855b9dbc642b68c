"""What routes and dependencies declare for the OpenAPI document: their authentication, the
second-factor gate, PEM answers.

Routes and dependencies import this module; the document builder (app.openapi.document) reads
what it marked. It imports nothing of the application, so any route may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from starlette.responses import Response

SECURITY_SCHEMES: dict[str, Any] = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "A session token from POST /auth/login, or an API token (POST /me/tokens)",
    },
    "session_cookie": {
        "type": "apiKey",
        "in": "cookie",
        "name": "nebula_session",
        "description": "The web UI's session; unsafe methods also need the X-CSRF-Token header",
    },
    "worker_credential": {
        "type": "apiKey",
        "in": "header",
        "name": "X-Nebula-Worker",
        "description": "A cluster's worker credential (POST /clusters/{id}/worker-credentials)",
    },
    "job_token": {
        "type": "http",
        "scheme": "bearer",
        "description": "The job token of one attempt of one role, from its claim or heartbeat",
    },
}
F = TypeVar("F", bound=Callable[..., Any])


def security(*requirements: dict[str, list[str]]) -> Callable[[F], F]:
    """Mark a dependency as the authentication of every route using it.

    Each requirement maps scheme names (SECURITY_SCHEMES) that must all be present; any one
    requirement will do (OpenAPI's `security`).
    """

    def mark(func: F) -> F:
        func.__security__ = list(requirements)  # type: ignore[attr-defined]
        return func

    return mark


def second_factor_gate(*, refuses: bool) -> Callable[[F], F]:
    """Mark a caller dependency for the document: whether the routes that use it refuse (403)
    a session that may only enrol a second factor (an admin without one, where the platform
    requires it). A route is refused unless one of its dependencies lifts the gate."""

    def mark(func: F) -> F:
        func.__second_factor_gate__ = refuses  # type: ignore[attr-defined]
        return func

    return mark


class PemResponse(Response):
    """PEM text (a certificate, a CRL, a public key)."""

    media_type = "application/x-pem-file"
