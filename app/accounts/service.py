"""Account rules: users, login, sessions, API tokens, life cycle (the lockout: attempts.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.accounts import passwords, second_factor, tokens
from app.accounts.attempts import Door, attempt_succeeded, begin_attempt, checking_password
from app.accounts.models import (
    AuthToken,
    Identity,
    LoginFailure,
    PasswordReset,
    ResetRequest,
    Role,
    TokenKind,
    TokenScope,
    User,
    UserStatus,
)
from app.audit import service as audit
from app.audit.service import Actor
from app.db import NewestFirst, Page, begin_reading, begin_writing, utcnow
from app.errors import Conflict, Forbidden, NotAuthenticated, NotFound
from app.grants import service as grants
from app.jobs.holds import set_paused_for_owner
from app.settings import Settings
from app.unit_of_work import commit_before_raising, commit_before_waiting
from app.workspaces import service as workspaces

LOGIN_FAILED = "invalid email or password"
SSO_REQUIRED = "this platform signs people in through single sign-on only"


def normalize_email(email: str) -> str:
    """Emails compare case-insensitively."""
    return email.strip().lower()


def create_user(
    db: Session,
    *,
    actor: Actor,
    email: str,
    display_name: str,
    role: Role,
    password: str | None,
    settings: Settings,
) -> User:
    """A new active user with a personal workspace; 409 if the email is taken.

    Without a password (an account made at its first single sign-on) password login is
    impossible until a reset link sets one.
    """
    email = normalize_email(email)
    if password is None:
        password_hash = passwords.UNUSABLE_HASH
    else:
        passwords.check_policy(password, email=email)
        # hashed before the transaction begins: nothing is locked while argon2 runs
        password_hash = passwords.hash_password(password, settings)
    if db.scalar(select(User.id).where(User.email == email)) is not None:
        raise Conflict("a user with this email already exists")
    user = User(
        email=email,
        display_name=display_name,
        role=role,
        status=UserStatus.active,
        password_hash=password_hash,
    )
    db.add(user)
    try:
        db.flush()
    except IntegrityError:  # a concurrent create with the same email won the race
        db.rollback()
        raise Conflict("a user with this email already exists") from None
    audit.record(db, actor=actor, action="user.create", subject=user, details={"role": role.value})
    workspaces.create(
        db,
        actor=actor,
        owner=user,
        name=workspaces.PERSONAL_WORKSPACE_NAME,
        settings=settings,
        personal=True,
    )
    return user


@dataclass(frozen=True)
class IssuedToken:
    """A token's record and its secret, which is shown this once."""

    record: AuthToken
    secret: str


def _issue(
    db: Session,
    *,
    user: User,
    kind: TokenKind,
    name: str,
    ttl: timedelta,
    scope: TokenScope = TokenScope.full,
) -> IssuedToken:
    secret = tokens.new_secret(
        tokens.SESSION_PREFIX if kind == TokenKind.session else tokens.API_PREFIX
    )
    record = AuthToken(
        user_id=user.id,
        kind=kind,
        name=name,
        token_hash=tokens.token_hash(secret),
        expires_at=utcnow() + ttl,
        scope=scope,
    )
    db.add(record)
    db.flush()
    return IssuedToken(record=record, secret=secret)


def login(
    db: Session,
    *,
    email: str,
    password: str,
    ip: str | None,
    settings: Settings,
    otp: str | None = None,
) -> tuple[User, IssuedToken]:
    """A new session for valid credentials; one message for every failure; lockout after N.

    The password is checked between transactions, never inside one: a short serialized
    write that counts the attempt as failed (so parallel guesses cannot outrun the
    lockout), a read that finds the account, argon2 holding nothing, then a short write
    that records the outcome (a right password uncounts its attempt).

    An account with a second factor also needs `otp`, a TOTP or recovery code: without
    one the answer says so (nothing was guessed, nothing counts); a wrong one leaves the
    attempt counted, so codes are throttled as passwords are. An admin without a factor,
    where the platform requires one, gets a session that can only enrol one.
    """
    if settings.require_sso:
        raise Forbidden(SSO_REQUIRED)

    email = normalize_email(email)
    door = Door(
        Actor(None, ip),
        "auth.login",
        "email",
        email[:64],
        "too many failed logins; try again later",
    )
    attempt = begin_attempt(db, door=door, email=email, ip=ip, settings=settings)
    begin_reading(db)
    user = db.scalar(select(User).where(User.email == email))
    commit_before_waiting(db)
    with checking_password(db, attempt):
        if user is None:
            passwords.burn_verify(password, settings)
            ok, checked_hash = False, None
        else:
            checked_hash = user.password_hash
            ok = passwords.verify_password(password, checked_hash, settings)
    begin_writing(db)
    if user is not None:
        # a password change or a suspension while argon2 ran wins over this login
        db.refresh(user)
        ok = ok and user.password_hash == checked_hash
    if not ok or user is None or user.status != UserStatus.active:
        audit.record(
            db,
            actor=Actor(None, ip),
            action="auth.login",
            subject_type="user" if user else "email",
            subject_id=user.id if user else email[:64],
            outcome="failure",
        )
        commit_before_raising(db)
        raise NotAuthenticated(LOGIN_FAILED)
    factor = second_factor.confirmed_factor(db, user_id=user.id)
    scope = TokenScope.full
    details: dict[str, str] = {}
    if factor is not None:
        if not otp:
            attempt_succeeded(db, attempt)  # no code was tried: nothing to count
            audit.record(
                db,
                actor=Actor(None, ip),
                action="auth.login",
                subject=user,
                outcome="needs_factor",
            )
            commit_before_raising(db)
            raise NotAuthenticated(second_factor.CODE_REQUIRED)
        used = second_factor.check_code(db, factor=factor, code=otp, settings=settings)
        if used is None:
            audit.record(
                db,
                actor=Actor(None, ip),
                action="auth.login",
                subject=user,
                outcome="failure",
                details={"factor": "totp"},
            )
            commit_before_raising(db)
            raise NotAuthenticated(second_factor.CODE_WRONG)
        details["factor"] = used
    elif settings.require_admin_totp and user.role == Role.admin:
        scope = TokenScope.enrol
        details["scope"] = scope.value
    attempt_succeeded(db, attempt)
    issued = _issue(
        db,
        user=user,
        kind=TokenKind.session,
        name="login",
        ttl=timedelta(hours=settings.session_ttl_hours),
        scope=scope,
    )
    audit.record(
        db, actor=Actor(user.id, ip), action="auth.login", subject=user, details=details or None
    )
    return user, issued


def start_session(
    db: Session, *, user: User, ip: str | None, settings: Settings, details: dict[str, str]
) -> IssuedToken:
    """A new session for a user who proved who they are some other way (single sign-on)."""
    issued = _issue(
        db,
        user=user,
        kind=TokenKind.session,
        name="login",
        ttl=timedelta(hours=settings.session_ttl_hours),
    )
    audit.record(db, actor=Actor(user.id, ip), action="auth.login", subject=user, details=details)
    return issued


# Built once: it runs on every authenticated request, and building costs more than running.
# Columns, not entities: loading ORM objects costs several times the query itself, and
# most requests need no more than who is calling; the rows load when a service asks.
_TOKEN_LOOKUP = (
    select(User.id, User.role, AuthToken.id, AuthToken.kind, AuthToken.scope)
    .join(User, User.id == AuthToken.user_id)
    .where(
        AuthToken.token_hash == bindparam("token_hash"),
        AuthToken.revoked_at.is_(None),
        AuthToken.expires_at > bindparam("now"),
        User.status == UserStatus.active,
    )
)


def resolve_token(db: Session, *, secret: str) -> Identity | None:
    """Who is behind a bearer secret: a live token of an active user, or None.

    One query, no write, checked against the database on every call: a revoked token, an
    ended session or a suspended user is refused by the next request.
    """
    params = {"token_hash": tokens.token_hash(secret), "now": utcnow()}
    row = db.connection().execute(_TOKEN_LOOKUP, params).first()
    if row is None:
        return None
    user_id, role, token_id, kind, scope = row
    return Identity(id=user_id, role=role, token_id=token_id, token_kind=kind, scope=scope)


def token_is_live(db: Session, *, token_id: str) -> bool:
    """Whether the token still authenticates: not revoked, not expired, its user active."""
    record = db.get(AuthToken, token_id)
    if record is None or record.revoked_at is not None or record.expires_at <= utcnow():
        return False
    user = db.get(User, record.user_id)
    return user is not None and user.status == UserStatus.active


def revoke_token(db: Session, *, actor: Actor, record: AuthToken) -> None:
    """End one token now."""
    if record.revoked_at is None:
        record.revoked_at = utcnow()
    audit.record(db, actor=actor, action=f"auth.{record.kind.value}.revoke", subject=record)


def revoke_all_tokens(db: Session, *, user_id: str, keep: str | None = None) -> int:
    """End every live session and API token of a user (but `keep`); how many ended."""
    stmt = (
        update(AuthToken)
        .where(AuthToken.user_id == user_id, AuthToken.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    if keep is not None:
        stmt = stmt.where(AuthToken.id != keep)
    return db.execute(stmt).rowcount or 0  # type: ignore[attr-defined]


def change_password(
    db: Session,
    *,
    actor: Actor,
    user: User,
    current_token: AuthToken,
    current_password: str,
    new_password: str,
    settings: Settings,
) -> None:
    """Set a new password; every other session and token of the user is revoked.

    A wrong current password counts as a failed login: a stolen session cannot guess it
    at leisure, and the account's lockout stops both doors at once. Argon2 runs outside
    any transaction (the caller's user is already loaded).
    """
    door = Door(actor, "user.password", "user", user.id, "too many failed attempts; try later")
    attempt = begin_attempt(db, door=door, email=user.email, ip=actor.ip, settings=settings)
    with checking_password(db, attempt):
        right = passwords.verify_password(current_password, user.password_hash, settings)
    if not right:
        audit.record(db, actor=actor, action="user.password", subject=user, outcome="failure")
        commit_before_raising(db)
        raise NotAuthenticated("current password is wrong")
    passwords.check_policy(new_password, email=user.email)
    with checking_password(db, attempt):
        new_hash = passwords.hash_password(new_password, settings)  # before any statement
    attempt_succeeded(db, attempt)
    user.password_hash = new_hash
    revoked = revoke_all_tokens(db, user_id=user.id, keep=current_token.id)
    audit.record(
        db, actor=actor, action="user.password", subject=user, details={"tokens_revoked": revoked}
    )


def create_api_token(
    db: Session,
    *,
    actor: Actor,
    user: User,
    name: str,
    expires_in_days: int,
    otp: str | None,
    settings: Settings,
) -> IssuedToken:
    """A named API token; its secret is returned once.

    A user with a second factor shows a fresh code for it (`otp`): a stolen session alone
    cannot mint a credential that outlives it.
    """
    second_factor.require_fresh_code(
        db, actor=actor, user=user, code=otp, action="auth.api.create", settings=settings
    )
    issued = _issue(
        db, user=user, kind=TokenKind.api, name=name, ttl=timedelta(days=expires_in_days)
    )
    audit.record(
        db, actor=actor, action="auth.api.create", subject=issued.record, details={"name": name}
    )
    return issued


_API_TOKENS = NewestFirst(
    AuthToken, (AuthToken.user_id == bindparam("user_id")) & (AuthToken.kind == TokenKind.api)
)
_USERS = NewestFirst(User)


def list_api_tokens(db: Session, *, user: User, page: Page) -> tuple[list[AuthToken], int]:
    """The user's API tokens (never their secrets), newest first."""
    return _API_TOKENS(db, user_id=user.id, page=page)


def get_own_api_token(db: Session, *, actor: Actor, user: User, token_id: str) -> AuthToken:
    """One of the user's API tokens; NotFound (audited) for anyone else's."""
    record = db.get(AuthToken, token_id)
    if record is None or record.user_id != user.id or record.kind != TokenKind.api:
        audit.deny(
            db, actor=actor, action="auth.api.access", subject_type="token", subject_id=token_id
        )
    return record


def list_users(db: Session, *, page: Page) -> tuple[list[User], int]:
    """Every user, newest first."""
    return _USERS(db, page=page)


def get_user(db: Session, *, user_id: str) -> User:
    """A user by id."""
    user = db.get(User, user_id)
    if user is None:
        raise NotFound()
    return user


def get_user_by_email(db: Session, *, email: str) -> User:
    """A user by email (any case); NotFound if none has it."""
    user = db.scalar(select(User).where(User.email == normalize_email(email)))
    if user is None:
        raise NotFound("no user has this email")
    return user


def update_user(
    db: Session, *, actor: Actor, user: User, display_name: str | None, role: Role | None
) -> User:
    """Change a user's display name or role (not a deleted user's)."""
    if user.status == UserStatus.deleted:
        raise Conflict("the user is deleted")
    changes: dict[str, str] = {}
    if display_name is not None and display_name != user.display_name:
        user.display_name = display_name
        changes["display_name"] = display_name
    if role is not None and role != user.role:
        if user.id == actor.user_id:
            raise Conflict("you cannot change your own role")
        user.role = role
        changes["role"] = role.value
    audit.record(db, actor=actor, action="user.update", subject=user, details=changes)
    return user


def _set_status(db: Session, *, actor: Actor, user: User, status: UserStatus, action: str) -> None:
    if user.id == actor.user_id:
        raise Conflict("you cannot change your own status")
    if user.status == UserStatus.deleted:
        raise Conflict("the user is deleted")
    user.status = status
    revoked = revoke_all_tokens(db, user_id=user.id) if status != UserStatus.active else 0
    # queued jobs wait while their owner is suspended (the reaper sends them on reactivation)
    held = set_paused_for_owner(db, owner_id=user.id, paused=status != UserStatus.active)
    audit.record(
        db,
        actor=actor,
        action=action,
        subject=user,
        details={"tokens_revoked": revoked, "jobs_held": held},
    )


def suspend(db: Session, *, actor: Actor, user: User) -> None:
    """Suspend: every session and token dies at once."""
    _set_status(db, actor=actor, user=user, status=UserStatus.suspended, action="user.suspend")


def reactivate(db: Session, *, actor: Actor, user: User) -> None:
    """Let a suspended user log in again."""
    _set_status(db, actor=actor, user=user, status=UserStatus.active, action="user.reactivate")


def delete_user(db: Session, *, actor: Actor, user: User) -> list[grants.EndedRequest]:
    """Mark deleted: login refused, credentials and data-access grants (both ways) revoked.

    Returns the requests it ended: the caller stops the jobs of those that were grants,
    after the commit.
    """
    _set_status(db, actor=actor, user=user, status=UserStatus.deleted, action="user.delete")
    return grants.end_grants_of_user(db, actor=actor, user_id=user.id)


def purge_expired(db: Session, *, settings: Settings) -> int:
    """Drop login failures past the lockout window and tokens that can no longer be used."""
    now = utcnow()
    failures = delete(LoginFailure).where(
        LoginFailure.at < now - timedelta(minutes=settings.lockout_window_minutes)
    )
    # an expired or revoked token authenticates nothing (its audit events keep its id);
    # revoked ones stay a day, so that their owner still sees them listed as revoked
    dead_tokens = delete(AuthToken).where(
        (AuthToken.expires_at < now) | (AuthToken.revoked_at < now - timedelta(days=1))
    )
    # reset requests only count within their window; links a day past their end serve no one
    requests = delete(ResetRequest).where(
        ResetRequest.at < now - timedelta(minutes=settings.reset_window_minutes)
    )
    links = delete(PasswordReset).where(PasswordReset.expires_at < now - timedelta(days=1))
    purged = 0
    for statement in (failures, dead_tokens, requests, links):
        purged += db.execute(statement).rowcount or 0  # type: ignore[attr-defined]
    return purged
