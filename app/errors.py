"""Domain errors raised by services; one handler maps them to HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar


class DomainError(Exception):
    """Base of the errors a service may raise; `status` is the HTTP answer."""

    status = 400

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class BadRequest(DomainError):
    """The input is well-formed but not acceptable."""

    status = 400


class NotAuthenticated(DomainError):
    """No valid credentials."""

    status = 401


class Forbidden(DomainError):
    """Authenticated, but the role or the grant does not allow it."""

    status = 403


class NotFound(DomainError):
    """Missing, or belonging to someone else (never reveal which)."""

    status = 404

    def __init__(self, detail: str = "not found") -> None:
        super().__init__(detail)


class Conflict(DomainError):
    """The request conflicts with the current state."""

    status = 409


class QuotaExceeded(DomainError):
    """A size limit or quota would be exceeded."""

    status = 413


class Invalid(DomainError):
    """Semantically invalid input (a weak password, a malformed file)."""

    status = 422


class TooManyAttempts(DomainError):
    """Rate limit or lockout."""

    status = 429


class InsufficientStorage(DomainError):
    """The server's disk is full: nothing was stored."""

    status = 507


ErrorTypes = tuple[type[DomainError], ...]
F = TypeVar("F", bound=Callable[..., Any])


def raises(*errors: type[DomainError], unsafe_only: ErrorTypes = ()) -> Callable[[F], F]:
    """Declare the domain errors a route or dependency answers with, for the OpenAPI document.

    `unsafe_only` are raised on unsafe methods alone (POST, PATCH, DELETE).
    """

    def mark(func: F) -> F:
        func.__raises__ = (*getattr(func, "__raises__", ()), *errors)  # type: ignore[attr-defined]
        func.__raises_unsafe__ = (  # type: ignore[attr-defined]
            *getattr(func, "__raises_unsafe__", ()),
            *unsafe_only,
        )
        return func

    return mark


def declared_errors(func: Callable[..., Any], *, unsafe: bool) -> ErrorTypes:
    """The errors `func` was marked with by `raises`."""
    found: ErrorTypes = getattr(func, "__raises__", ())
    if unsafe:
        found += getattr(func, "__raises_unsafe__", ())
    return found
