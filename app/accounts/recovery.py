"""Password recovery: one-time reset links, issued by an admin or mailed on request.

A link carries a 256-bit secret of which only the sha256 is stored; it works once, for
`reset_link_minutes`, and only the newest link of an account works. Using it sets a new
password and ends every session and token of the account. "Forgot password" answers the
same whether or not the address has an account, and is rate-limited per email address,
per account and per client address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import ColumnElement, delete, func, select, text, update
from sqlalchemy.orm import Session

from app.accounts import passwords, tokens
from app.accounts.mail import Mail
from app.accounts.models import LoginFailure, PasswordReset, ResetRequest, User, UserStatus
from app.accounts.service import normalize_email, revoke_all_tokens
from app.audit import service as audit
from app.audit.service import Actor
from app.db import begin_reading, begin_writing, utcnow
from app.errors import BadRequest, Conflict, TooManyAttempts
from app.settings import Settings
from app.unit_of_work import commit_before_raising, commit_before_waiting

RESET_PREFIX = "nbr_"
RESET_PAGE = "/reset-password"
INVALID_LINK = "this reset link is invalid, already used or expired"
FORGOT_ANSWER = "if an account has this address, a reset link has been sent to it"
TOO_MANY_REQUESTS = "too many reset requests; try again later"
VIA_ADMIN = "admin"
VIA_EMAIL = "email"
# Any constant works; it names the advisory lock that serializes counting reset requests.
_REQUESTS_LOCK_KEY = 0x4E4552455345


@dataclass(frozen=True)
class IssuedReset:
    """A reset link's record and its URL, which holds the secret and is shown this once."""

    record: PasswordReset
    url: str = field(repr=False)


def reset_url(settings: Settings, secret: str) -> str:
    """The web UI's reset page with the secret in the fragment (never sent to a server log)."""
    return f"{settings.public_url.rstrip('/')}{RESET_PAGE}#token={secret}"


def _issue(db: Session, *, user: User, via: str, settings: Settings) -> IssuedReset:
    now = utcnow()
    # only the newest link works: an older one, perhaps read by someone else, ends here
    db.execute(
        update(PasswordReset)
        .where(
            PasswordReset.user_id == user.id,
            PasswordReset.used_at.is_(None),
            PasswordReset.expires_at > now,
        )
        .values(expires_at=now)
    )
    secret = tokens.new_secret(RESET_PREFIX)
    record = PasswordReset(
        user_id=user.id,
        token_hash=tokens.token_hash(secret),
        via=via,
        expires_at=now + timedelta(minutes=settings.reset_link_minutes),
    )
    db.add(record)
    db.flush()
    return IssuedReset(record=record, url=reset_url(settings, secret))


def issue_link(db: Session, *, actor: Actor, user: User, settings: Settings) -> IssuedReset:
    """A reset link for an admin to hand over (audited; its URL is in this answer only)."""
    if user.status != UserStatus.active:
        raise Conflict("the user is not active")
    issued = _issue(db, user=user, via=VIA_ADMIN, settings=settings)
    audit.record(
        db,
        actor=actor,
        action="user.reset_link",
        subject=user,
        details={"via": VIA_ADMIN, "link_id": issued.record.id},
    )
    return issued


def _count(db: Session, *conditions: ColumnElement[bool]) -> int:
    return db.scalar(select(func.count()).select_from(ResetRequest).where(*conditions)) or 0


def request_reset(db: Session, *, email: str, ip: str | None, settings: Settings) -> Mail | None:
    """Record a "forgot password" request; the mail to send after the commit, if any.

    Known and unknown addresses take the same path up to the lookup, and the caller
    answers both alike. TooManyAttempts (for any address, so it tells nothing) past the
    limits per email address, per account and per client address.
    """
    email = normalize_email(email)
    begin_writing(db)
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _REQUESTS_LOCK_KEY})
    since = utcnow() - timedelta(minutes=settings.reset_window_minutes)
    user = db.scalar(select(User).where(User.email == email))
    limited = _count(db, ResetRequest.email == email, ResetRequest.at >= since) >= (
        settings.reset_requests_per_email
    )
    if not limited and ip is not None:
        limited = _count(db, ResetRequest.ip == ip, ResetRequest.at >= since) >= (
            settings.reset_requests_per_ip
        )
    if not limited and user is not None:
        by_account = (
            db.scalar(
                select(func.count())
                .select_from(PasswordReset)
                .where(
                    PasswordReset.user_id == user.id,
                    PasswordReset.via == VIA_EMAIL,
                    PasswordReset.created_at >= since,
                )
            )
            or 0
        )
        limited = by_account >= settings.reset_requests_per_email
    subject_type, subject_id = ("user", user.id) if user is not None else ("email", email[:64])
    if limited:
        audit.record(
            db,
            actor=Actor(None, ip),
            action="auth.password_reset.request",
            outcome="limited",
            subject_type=subject_type,
            subject_id=subject_id,
        )
        commit_before_raising(db)
        raise TooManyAttempts(TOO_MANY_REQUESTS)
    db.add(ResetRequest(email=email, ip=ip))
    mail = None
    outcome = "unknown"
    if user is not None and user.status == UserStatus.active:
        issued = _issue(db, user=user, via=VIA_EMAIL, settings=settings)
        mail = Mail(
            to=user.email,
            subject="Reset your Nebula password",
            body=(
                "Someone, perhaps you, asked to reset the password of your Nebula account.\n\n"
                f"Open this link within {settings.reset_link_minutes} minutes to choose a new "
                f"password:\n\n{issued.url}\n\n"
                "The link works once. If you did not ask for it, ignore this message: your "
                "password stays as it is.\n"
            ),
        )
        outcome = "success"
    elif user is not None:
        outcome = "inactive"
    audit.record(
        db,
        actor=Actor(None, ip),
        action="auth.password_reset.request",
        outcome=outcome,
        subject_type=subject_type,
        subject_id=subject_id,
    )
    return mail


def _refuse(db: Session, *, ip: str | None, link: PasswordReset | None, why: str) -> None:
    audit.record(
        db,
        actor=Actor(None, ip),
        action="auth.password_reset",
        subject_type="password_reset",
        subject_id=link.id if link is not None else "unknown",
        outcome="failure",
        details={"why": why},
    )
    commit_before_raising(db)
    raise BadRequest(INVALID_LINK)


def reset_password(
    db: Session, *, secret: str, new_password: str, ip: str | None, settings: Settings
) -> User:
    """Use a reset link: a new password, every session and token of the account ended.

    One message for every refusal (unknown, used, expired, superseded, inactive account);
    a weak password (422) leaves the link usable. Argon2 runs between transactions, and
    the link is taken by a conditional update, so two uses at once cannot both pass.
    """
    begin_reading(db)
    link = db.scalar(
        select(PasswordReset).where(PasswordReset.token_hash == tokens.token_hash(secret))
    )
    user = db.get(User, link.user_id) if link is not None else None
    commit_before_waiting(db)
    now = utcnow()
    why = None
    if link is None or user is None:
        why = "unknown"
    elif link.used_at is not None:
        why = "used"
    elif link.expires_at <= now:
        why = "expired"
    elif user.status != UserStatus.active:
        why = "inactive"
    if why is not None:
        begin_writing(db)
        _refuse(db, ip=ip, link=link, why=why)
    assert link is not None and user is not None
    passwords.check_policy(new_password, email=user.email)
    new_hash = passwords.hash_password(new_password, settings)
    begin_writing(db)
    taken = db.execute(
        update(PasswordReset)
        .where(
            PasswordReset.id == link.id,
            PasswordReset.used_at.is_(None),
            PasswordReset.expires_at > utcnow(),
        )
        .values(used_at=utcnow())
    )
    if not taken.rowcount:  # type: ignore[attr-defined]
        _refuse(db, ip=ip, link=link, why="used")
    db.refresh(user)
    if user.status != UserStatus.active:
        _refuse(db, ip=ip, link=link, why="inactive")
    user.password_hash = new_hash
    revoked = revoke_all_tokens(db, user_id=user.id)
    # the owner of the address is back in: earlier failed guesses no longer lock them out
    db.execute(delete(LoginFailure).where(LoginFailure.email == user.email))
    audit.record(
        db,
        actor=Actor(user.id, ip),
        action="user.password_reset",
        subject=user,
        details={"via": link.via, "link_id": link.id, "tokens_revoked": revoked},
    )
    return user
