"""The TOTP second factor: enrolment, codes at sign-in and for API tokens, recovery codes.

Secrets are sealed (AES-GCM) under a key derived from the platform secret, which the
database does not hold; recovery codes and a digest of each secret are kept as HMACs
under another. A code's step is used once per account (a replayed or older code fails),
a recovery code once. Wrong codes count as failed logins of the account: the same
lockout stops guessing passwords and guessing codes.
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field

import segno
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.accounts import totp
from app.accounts.attempts import LOCKED_MESSAGE, Door, attempt_succeeded, begin_attempt
from app.accounts.models import AuthToken, RecoveryCode, Role, TokenScope, TotpFactor, User
from app.audit import service as audit
from app.audit.service import Actor
from app.db import begin_writing, utcnow
from app.errors import BadRequest, Conflict, Forbidden, Invalid
from app.keyring import Purpose, subkey
from app.settings import Settings
from app.unit_of_work import commit_before_raising

CODE_REQUIRED = "a second-factor code is required"
CODE_WRONG = "wrong second-factor code"
FRESH_CODE_REQUIRED = "a fresh second-factor code is required"
SECRET_IN_USE = "this secret is already in use; use a fresh one"
_AAD = b"nebula/totp-secret/v1"


def _seal(settings: Settings, key: bytes, user_id: str) -> str:
    nonce = os.urandom(12)
    sealed = AESGCM(subkey(settings, Purpose.totp_seal)).encrypt(
        nonce, key, _AAD + user_id.encode()
    )
    return base64.b64encode(nonce + sealed).decode()


def _unseal(settings: Settings, sealed: str, user_id: str) -> bytes:
    raw = base64.b64decode(sealed)
    # bound to its user: a sealed secret copied onto another row does not open there
    return AESGCM(subkey(settings, Purpose.totp_seal)).decrypt(
        raw[:12], raw[12:], _AAD + user_id.encode()
    )


def _digest(settings: Settings, value: str) -> str:
    return totp.keyed_digest(subkey(settings, Purpose.totp_digest), value)


def _code_digest(settings: Settings, user_id: str, code: str) -> str:
    return _digest(settings, f"recovery:{user_id}:{totp.normalize_recovery_code(code)}")


def confirmed_factor(db: Session, *, user_id: str) -> TotpFactor | None:
    """The user's enrolled (confirmed) factor, if any."""
    factor = db.get(TotpFactor, user_id)
    return factor if factor is not None and factor.confirmed_at is not None else None


@dataclass(frozen=True)
class Enrolment:
    """What an authenticator app needs; the secret is shown this once."""

    secret: str = field(repr=False)
    otpauth_uri: str = field(repr=False)
    qr_svg: str = field(repr=False)


def begin_enrolment(
    db: Session, *, actor: Actor, user: User, secret: str | None, settings: Settings
) -> Enrolment:
    """Start enrolling a factor: a fresh secret (or a hardware token's own), not yet active.

    Conflict if one is enrolled already, or if the secret is another account's: one secret
    in two accounts would let either holder pass as the other.
    """
    begin_writing(db)
    existing = db.get(TotpFactor, user.id)
    if existing is not None and existing.confirmed_at is not None:
        raise Conflict("a second factor is enrolled already; remove it first")
    try:
        key = totp.decode_secret(secret if secret is not None else totp.new_secret())
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    digest = _digest(settings, "secret:" + base64.b64encode(key).decode())
    holder = db.scalar(select(TotpFactor.user_id).where(TotpFactor.secret_digest == digest))
    if holder is not None:
        audit.record(
            db,
            actor=actor,
            action="user.totp.enrol",
            subject=user,
            outcome="failure",
            details={"why": "secret in use"},
        )
        commit_before_raising(db)
        raise Conflict(SECRET_IN_USE)
    if existing is not None:
        db.delete(existing)
        db.flush()
    db.add(
        TotpFactor(
            user_id=user.id, secret_sealed=_seal(settings, key, user.id), secret_digest=digest
        )
    )
    try:
        db.flush()
    except IntegrityError:  # the same secret, enrolled at this moment by another account
        db.rollback()
        raise Conflict(SECRET_IN_USE) from None
    audit.record(db, actor=actor, action="user.totp.enrol", subject=user, outcome="begun")
    secret_b32 = base64.b32encode(key).decode().rstrip("=")
    uri = totp.otpauth_uri(secret_b32, account=user.email, issuer=settings.totp_issuer)
    qr = segno.make(uri, error="m").svg_inline(scale=4, border=2)
    return Enrolment(secret=secret_b32, otpauth_uri=uri, qr_svg=qr)


def check_code(db: Session, *, factor: TotpFactor, code: str, settings: Settings) -> str | None:
    """Spend a TOTP code or a recovery code of the factor's user: "totp", "recovery" or None.

    A TOTP code passes within one step of now and only for a step later than the last one
    used; a recovery code passes once. Both are taken by conditional updates, so two
    requests with one code cannot both pass. Call it in a writing transaction.
    """
    code = code.strip()
    if len(code) == totp.DIGITS and code.isascii() and code.isdigit():
        try:
            key = _unseal(settings, factor.secret_sealed, factor.user_id)
        except (InvalidTag, ValueError):
            return None
        step = totp.matching_step(key, code, time.time())
        if step is None:
            return None
        taken = db.execute(
            update(TotpFactor)
            .where(
                TotpFactor.user_id == factor.user_id,
                or_(TotpFactor.last_step.is_(None), TotpFactor.last_step < step),
            )
            .values(last_step=step)
            .execution_options(synchronize_session=False)
        )
        return "totp" if taken.rowcount else None  # type: ignore[attr-defined]
    if len(code) > 32:
        return None
    taken = db.execute(
        update(RecoveryCode)
        .where(
            RecoveryCode.user_id == factor.user_id,
            RecoveryCode.code_digest == _code_digest(settings, factor.user_id, code),
            RecoveryCode.used_at.is_(None),
        )
        .values(used_at=utcnow())
    )
    return "recovery" if taken.rowcount else None  # type: ignore[attr-defined]


def _new_recovery_codes(db: Session, *, user_id: str, settings: Settings) -> list[str]:
    db.execute(delete(RecoveryCode).where(RecoveryCode.user_id == user_id))
    codes = totp.new_recovery_codes()
    for code in codes:
        db.add(RecoveryCode(user_id=user_id, code_digest=_code_digest(settings, user_id, code)))
    db.flush()
    return codes


def confirm_enrolment(
    db: Session, *, actor: Actor, user: User, token: AuthToken, code: str, settings: Settings
) -> list[str]:
    """Prove the app holds the secret: the factor is active, ten recovery codes (shown once).

    Wrong codes count as failed logins of the account. The session that confirms has now
    shown the factor, so a session limited to enrolling becomes a full one.
    """
    door = Door(actor, "user.totp.confirm", "user", user.id, LOCKED_MESSAGE)
    attempt = begin_attempt(db, door=door, email=user.email, ip=actor.ip, settings=settings)
    begin_writing(db)
    factor = db.get(TotpFactor, user.id)
    if factor is None or factor.confirmed_at is not None:
        attempt_succeeded(db, attempt)
        commit_before_raising(db)
        raise Conflict("no enrolment is in progress; begin one first")
    if not (
        len(code.strip()) == totp.DIGITS
        and check_code(db, factor=factor, code=code, settings=settings)
    ):
        audit.record(db, actor=actor, action="user.totp.confirm", subject=user, outcome="failure")
        commit_before_raising(db)
        raise BadRequest(CODE_WRONG)
    attempt_succeeded(db, attempt)
    factor.confirmed_at = utcnow()
    codes = _new_recovery_codes(db, user_id=user.id, settings=settings)
    db.refresh(token)
    if token.scope != TokenScope.full:
        token.scope = TokenScope.full
    audit.record(db, actor=actor, action="user.totp.confirm", subject=user)
    return codes


def require_fresh_code(
    db: Session, *, actor: Actor, user: User, code: str | None, action: str, settings: Settings
) -> None:
    """For a sensitive step (minting an API token): a code now, if the user has a factor.

    Forbidden without one or with a wrong one; wrong codes count as failed logins.
    """
    begin_writing(db)
    factor = confirmed_factor(db, user_id=user.id)
    if factor is None:
        return
    if not code:
        raise Forbidden(FRESH_CODE_REQUIRED)
    door = Door(actor, action, "user", user.id, LOCKED_MESSAGE)
    attempt = begin_attempt(db, door=door, email=user.email, ip=actor.ip, settings=settings)
    begin_writing(db)
    db.refresh(factor)
    if check_code(db, factor=factor, code=code, settings=settings) is None:
        audit.record(
            db,
            actor=actor,
            action=action,
            subject=user,
            outcome="failure",
            details={"why": "second factor"},
        )
        commit_before_raising(db)
        raise Forbidden(FRESH_CODE_REQUIRED)
    attempt_succeeded(db, attempt)


def remove(db: Session, *, actor: Actor, user: User, code: str, settings: Settings) -> None:
    """Remove the user's factor and recovery codes, proven by a code now.

    Refused for admins while the platform requires their factor: they enrol a new one
    by asking another admin, not by dropping theirs.
    """
    if settings.require_admin_totp and user.role == Role.admin:
        raise Conflict("admins must keep a second factor on this platform")
    require_fresh_code(
        db, actor=actor, user=user, code=code, action="user.totp.remove", settings=settings
    )
    begin_writing(db)
    found = db.execute(delete(TotpFactor).where(TotpFactor.user_id == user.id)).rowcount  # type: ignore[attr-defined]
    db.execute(delete(RecoveryCode).where(RecoveryCode.user_id == user.id))
    if not found:
        raise Conflict("no second factor is enrolled")
    audit.record(db, actor=actor, action="user.totp.remove", subject=user)


def status(db: Session, *, user: User) -> tuple[bool, int]:
    """Whether the user has an enrolled factor, and how many recovery codes are left."""
    enrolled = confirmed_factor(db, user_id=user.id) is not None
    left = len(
        db.scalars(
            select(RecoveryCode.id).where(
                RecoveryCode.user_id == user.id, RecoveryCode.used_at.is_(None)
            )
        ).all()
    )
    return enrolled, left
