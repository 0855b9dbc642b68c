"""Password attempts, counted before they are checked: the lockout of an account or an address.

Logins, password changes and second-factor codes go through the same door: the attempt is
counted as failed and committed, the secret is checked holding no lock, and a right one
uncounts it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import ColumnElement, delete, func, select, text
from sqlalchemy.orm import Session

from app.accounts.models import LoginFailure
from app.audit import service as audit
from app.audit.service import Actor
from app.db import begin_writing, utcnow
from app.errors import TooManyAttempts
from app.settings import Settings
from app.unit_of_work import commit_before_raising, commit_before_waiting

LOCKED_MESSAGE = "too many failed attempts; try later"


def _recent_failures(db: Session, match: ColumnElement[bool], *, settings: Settings) -> int:
    """Failed attempts within the lockout window that `match` (an email, an address)."""
    since = utcnow() - timedelta(minutes=settings.lockout_window_minutes)
    return (
        db.scalar(
            select(func.count()).select_from(LoginFailure).where(match, LoginFailure.at >= since)
        )
        or 0
    )


# Any constant works; it names the advisory lock that serializes counting attempts.
_ATTEMPTS_LOCK_KEY = 0x4E4542554C42


@dataclass(frozen=True)
class Door:
    """Where a password is tried, for the audit trail and the answer when locked."""

    actor: Actor
    action: str
    subject_type: str
    subject_id: str
    locked_message: str


def begin_attempt(
    db: Session, *, door: Door, email: str, ip: str | None, settings: Settings
) -> str:
    """Count one password attempt as failed before it is checked, and commit; its id.

    TooManyAttempts when the account, or the address it comes from, is locked out. The
    count and the insert are one short serialized transaction (an advisory lock on
    PostgreSQL, SQLite's write lock), so parallel attempts cannot all pass one count;
    the hash is checked after the commit, holding no lock.
    """
    begin_writing(db)
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ATTEMPTS_LOCK_KEY})
    by_account = _recent_failures(db, LoginFailure.email == email, settings=settings)
    locked = by_account >= settings.lockout_failures
    if ip is not None and not locked:
        by_address = _recent_failures(db, LoginFailure.ip == ip, settings=settings)
        locked = by_address >= settings.login_ip_failures
    if locked:
        # one counted row per window for a locked door hammered on (app/audit/refusals.py)
        audit.record_refusal(
            db,
            actor=door.actor,
            action=door.action,
            subject_type=door.subject_type,
            subject_id=door.subject_id,
            outcome="locked",
            status=429,
        )
        commit_before_raising(db)
        raise TooManyAttempts(door.locked_message)
    attempt = LoginFailure(email=email, ip=ip)
    db.add(attempt)
    commit_before_waiting(db)  # counted before argon2 runs
    return attempt.id


def attempt_succeeded(db: Session, attempt_id: str) -> None:
    """The password was right: the attempt no longer counts."""
    db.execute(delete(LoginFailure).where(LoginFailure.id == attempt_id))


@contextmanager
def checking_password(db: Session, attempt_id: str) -> Iterator[None]:
    """Argon2 for a counted attempt. Refused by a full password gate (429), no password was
    checked: the attempt no longer counts, and the refusal leaves nothing written."""
    try:
        yield
    except TooManyAttempts:
        begin_writing(db)
        attempt_succeeded(db, attempt_id)
        commit_before_raising(db)
        raise
