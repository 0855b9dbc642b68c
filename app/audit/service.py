"""Appending to and verifying the audit hash chain."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.audit.models import AuditEvent
from app.db import begin_writing, utcnow
from app.errors import Forbidden, NotFound

GENESIS_HASH = "0" * 64
# Any constant works; it names the one advisory lock that serializes appends on PostgreSQL.
_CHAIN_LOCK_KEY = 0x4E4542554C41


@dataclass(frozen=True)
class Actor:
    """Who is acting, for the audit trail."""

    user_id: str | None
    ip: str | None = None


SYSTEM = Actor(user_id=None)


def canonical_json(event: AuditEvent) -> bytes:
    """The bytes an event's hash covers: every field but id and the hashes, key-sorted."""
    body = {
        "seq": event.seq,
        "at": event.at.astimezone(UTC).isoformat(timespec="microseconds"),
        "actor_id": event.actor_id,
        "action": event.action,
        "subject_type": event.subject_type,
        "subject_id": event.subject_id,
        "outcome": event.outcome,
        "ip": event.ip,
        "details": event.details,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def chain_hash(prev_hash: str, event: AuditEvent) -> str:
    """sha256(prev_hash || canonical JSON)."""
    return hashlib.sha256(prev_hash.encode() + canonical_json(event)).hexdigest()


def _lock_chain(db: Session) -> None:
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _CHAIN_LOCK_KEY})
    # SQLite: every writing transaction starts with BEGIN IMMEDIATE (app/db.py), which
    # already holds the database's single write lock; read-only ones cannot append.


def record(
    db: Session,
    *,
    actor: Actor,
    action: str,
    subject_type: str | None = None,
    subject_id: str | None = None,
    outcome: str = "success",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event in the caller's transaction; it commits or rolls back with the change."""
    _lock_chain(db)
    last = db.execute(
        select(AuditEvent.seq, AuditEvent.hash).order_by(AuditEvent.seq.desc()).limit(1)
    ).first()
    seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
    event = AuditEvent(
        seq=seq,
        at=utcnow(),
        actor_id=actor.user_id,
        action=action,
        subject_type=subject_type,
        # ids come from URLs too: a forged, over-long one is still recorded, cut to the column
        subject_id=subject_id[:64] if subject_id is not None else None,
        outcome=outcome,
        ip=actor.ip,
        details=details or {},
        prev_hash=prev_hash,
    )
    event.hash = chain_hash(prev_hash, event)
    db.add(event)
    db.flush()
    return event


def deny(
    db: Session,
    *,
    actor: Actor,
    action: str,
    subject_type: str,
    subject_id: str,
    forbidden: str | None = None,
) -> NoReturn:
    """Audit a refused access and raise: NotFound, or Forbidden(`forbidden`) when given.

    Whatever the request changed before is rolled back; only the denial is committed.
    """
    db.rollback()
    begin_writing(db)  # also on a GET, whose transactions are otherwise read-only
    record(
        db,
        actor=actor,
        action=action,
        subject_type=subject_type,
        subject_id=subject_id,
        outcome="denied",
        details={"status": 403 if forbidden else 404},
    )
    db.commit()
    if forbidden:
        raise Forbidden(forbidden)
    raise NotFound()


@dataclass(frozen=True)
class Verification:
    """The result of recomputing the chain."""

    ok: bool
    count: int
    first_bad_seq: int | None


def verify(db: Session) -> Verification:
    """Recompute the chain; report the first event altered, removed or inserted."""
    expected_seq, prev_hash, count = 1, GENESIS_HASH, 0
    rows: Iterator[AuditEvent] = db.scalars(
        select(AuditEvent).order_by(AuditEvent.seq).execution_options(yield_per=1000)
    )
    for event in rows:
        count += 1
        if event.seq != expected_seq:  # a gap: the event at expected_seq was removed
            return Verification(ok=False, count=count, first_bad_seq=expected_seq)
        if event.prev_hash != prev_hash or chain_hash(prev_hash, event) != event.hash:
            return Verification(ok=False, count=count, first_bad_seq=event.seq)
        prev_hash, expected_seq = event.hash, expected_seq + 1
    return Verification(ok=True, count=count, first_bad_seq=None)


def query(
    db: Session,
    *,
    actor_id: str | None = None,
    action: str | None = None,
    outcome: str | None = None,
    subject_id: str | None = None,
    involving_user: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[AuditEvent], int]:
    """Events matching the filters, newest first, and their total count."""
    stmt = select(AuditEvent)
    if actor_id is not None:
        stmt = stmt.where(AuditEvent.actor_id == actor_id)
    if action is not None:
        stmt = stmt.where(AuditEvent.action == action)
    if outcome is not None:
        stmt = stmt.where(AuditEvent.outcome == outcome)
    if subject_id is not None:
        stmt = stmt.where(AuditEvent.subject_id == subject_id)
    if involving_user is not None:
        stmt = stmt.where(
            (AuditEvent.actor_id == involving_user) | (AuditEvent.subject_id == involving_user)
        )
    if since is not None:
        stmt = stmt.where(AuditEvent.at >= since)
    if until is not None:
        stmt = stmt.where(AuditEvent.at < until)
    total = db.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    items = db.scalars(stmt.order_by(AuditEvent.seq.desc()).limit(limit).offset(offset)).all()
    return list(items), total


def iter_all(db: Session, *, batch: int = 1000) -> Iterator[AuditEvent]:
    """Every event in chain order, in short read transactions so writers are not held up."""
    last_seq = 0
    while True:
        events = db.scalars(
            select(AuditEvent)
            .where(AuditEvent.seq > last_seq)
            .order_by(AuditEvent.seq)
            .limit(batch)
        ).all()
        # end the transaction (nothing held between batches), keep the batch loaded
        db.commit()
        db.expunge_all()
        if not events:
            return
        yield from events
        last_seq = events[-1].seq
