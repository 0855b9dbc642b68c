"""Appending to and verifying the audit hash chain."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, NoReturn, Protocol, TypeVar
from weakref import WeakKeyDictionary

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from app import seals
from app.audit import refusals
from app.audit.anchor import (
    Anchor,
    AnchorLog,
    Mirror,
    MirrorConflict,
    anchor_signing_key,
    sign,
    signed_by_any,
    trusted_public_keys,
)
from app.audit.mirrors import MirrorSettingError, mirror_for
from app.audit.models import AuditEvent
from app.audit.refusals import Verdict
from app.db import Page, begin_writing, utcnow
from app.errors import Forbidden, NotFound, TooManyAttempts
from app.keyring import Purpose, subkey
from app.settings import Settings
from app.unit_of_work import commit_before_raising, commit_before_waiting

log = logging.getLogger("nebula.audit")

GENESIS_HASH = "0" * 64
# Any constant works; it names the one advisory lock that serializes appends on PostgreSQL.
_CHAIN_LOCK_KEY = 0x4E4542554C41

# The chain key of each engine's sessions. A key is bound where the engine is made (the
# app, the CLI), from settings, so that the many services that record events need not
# carry settings; a session on an engine without one refuses to record rather than
# write events nobody can verify.
_chain_keys: WeakKeyDictionary[Engine, bytes] = WeakKeyDictionary()


def use_chain_key(engine: Engine, settings: Settings) -> Engine:
    """Key the audit chain, and the seals of rows that confer access, of `engine`'s sessions."""
    _chain_keys[engine] = subkey(settings, Purpose.audit_chain)
    refusals.bind(
        engine,
        window_s=settings.audit_refusal_window_s,
        per_window=settings.audit_refusals_per_window,
    )
    seals.use_seal_key(engine, settings)
    return engine


def _chain_key(db: Session) -> bytes:
    key = _chain_keys.get(db.get_bind().engine)
    if key is None:
        raise RuntimeError("no audit chain key for this engine: call audit.use_chain_key first")
    return key


@dataclass(frozen=True)
class Actor:
    """Who is acting, for the audit trail."""

    user_id: str | None
    ip: str | None = None


SYSTEM = Actor(user_id=None)


class Subject(Protocol):
    """A row that events are about, named in the trail by its table's `audit_type` and its id."""

    audit_type: ClassVar[str]

    @property
    def id(self) -> str: ...


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


def chain_hash(key: bytes, prev_hash: str, event: AuditEvent) -> str:
    """HMAC-SHA256 under the chain key of prev_hash || canonical JSON."""
    return hmac.new(key, prev_hash.encode() + canonical_json(event), hashlib.sha256).hexdigest()


def legacy_chain_hash(prev_hash: str, event: AuditEvent) -> str:
    """sha256(prev_hash || canonical JSON): the unkeyed chain of deployments before the key."""
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
    subject: Subject | None = None,
    subject_type: str | None = None,
    subject_id: str | None = None,
    outcome: str = "success",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event in the caller's transaction; it commits or rolls back with the change.

    The event is about `subject`, a row at hand, or about the `subject_type` and
    `subject_id` given when only an id is known (a refused lookup, a failed login).
    """
    if subject is not None:
        subject_type, subject_id = subject.audit_type, subject.id
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
    event.hash = chain_hash(_chain_key(db), prev_hash, event)
    db.add(event)
    db.flush()
    return event


S = TypeVar("S", bound=Subject)


def record_creation(
    db: Session, row: S, *, actor: Actor, action: str, details: dict[str, Any] | None = None
) -> S:
    """Add a new row, flushed for its id, and record its creation as `action` with it."""
    db.add(row)
    db.flush()
    record(db, actor=actor, action=action, subject=row, details=details)
    return row


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

    Whatever the request changed before is rolled back; only the denial is committed, and
    only the first of identical ones in a window (`record_refusal`). Past its user's or
    its address's budget of refusals, TooManyAttempts instead.
    """
    db.rollback()
    verdict = record_refusal(
        db,
        actor=actor,
        action=action,
        subject_type=subject_type,
        subject_id=subject_id,
        outcome="denied",
        status=403 if forbidden else 404,
    )
    if verdict is Verdict.record:
        commit_before_raising(db)
    if verdict is Verdict.throttle:
        raise TooManyAttempts("too many refused requests; try again later")
    if forbidden:
        raise Forbidden(forbidden)
    raise NotFound()


def record_refusal(
    db: Session,
    *,
    actor: Actor,
    action: str,
    subject_type: str,
    subject_id: str,
    outcome: str,
    status: int,
) -> Verdict:
    """Append a refusal (in a writing transaction the caller commits) unless it repeats one
    of its window, which only counts, or its user or address is over its budget (throttle).

    Nothing is written, and no lock taken, for a repeat or a throttled refusal: their counts
    are appended as one row per window (app/audit/refusals.py).
    """
    windows = refusals.windows_of(db.get_bind().engine)
    kind = (actor.user_id, actor.ip, action, subject_type, subject_id[:64], outcome, status)
    verdict = windows.judge(kind)
    if verdict is Verdict.record:
        begin_writing(db)  # also on a GET, whose transactions are otherwise read-only
        _append_counted(db, windows.due())
        record(
            db,
            actor=actor,
            action=action,
            subject_type=subject_type,
            subject_id=subject_id,
            outcome=outcome,
            details={"status": status},
        )
    return verdict


def _append_counted(db: Session, rows: list[refusals.CountedRow]) -> None:
    for row in rows:
        record(
            db,
            actor=Actor(row.actor_id, row.ip),
            action=row.action,
            subject_type=row.subject_type,
            subject_id=row.subject_id,
            outcome=row.outcome,
            details=row.details,
        )


def flush_refusals(db: Session, *, everything: bool = False) -> int:
    """Append the counted rows of refusal windows that have ended (or of all, at shutdown);
    the caller commits. The number of rows."""
    windows = refusals.windows_of(db.get_bind().engine)
    if not windows.pending(everything=everything):
        return 0
    rows = windows.due(everything=everything)
    try:
        begin_writing(db)
        _append_counted(db, rows)
    except BaseException:
        windows.give_back(rows)
        raise
    return len(rows)


ProblemKind = Literal[
    "removed", "rewritten", "forged", "tail_deleted", "unanchored", "anchors_disagree"
]

_PROBLEM_TEXT: dict[str, str] = {
    "removed": "missing from the middle of the chain",
    "rewritten": (
        "not what the platform wrote: their keyed hash or the signed anchor disagrees"
        " (altered, or recomputed without the key)"
    ),
    "forged": "after the newest signed anchor and not written by the platform (inserted)",
    "tail_deleted": "missing from the end: the newest signed anchor covers them",
}
# Past this many findings the log is plainly broken; the first ones say where and how.
_MAX_PROBLEMS = 100


@dataclass(frozen=True)
class Problem:
    """One finding of `verify`: what is wrong with a run of consecutive events."""

    kind: ProblemKind
    first_seq: int
    last_seq: int

    @property
    def detail(self) -> str:
        """The finding in words."""
        if self.kind == "unanchored":
            return (
                "unanchored: no valid signed anchor, so deleted newest events would go unseen;"
                " restore the anchor file (data dir audit/anchors.jsonl) from its backup"
            )
        if self.kind == "anchors_disagree":
            if self.first_seq < self.last_seq:
                return (
                    f"anchors_disagree: the local anchor file ends at seq {self.first_seq} but"
                    f" the anchor mirror holds a signed anchor at seq {self.last_seq}: the file"
                    " was cut back; restore it from the mirror and treat it as tampering"
                )
            if self.first_seq > self.last_seq:
                return (
                    "anchors_disagree: the anchor mirror cannot be read or holds no anchor"
                    f" while the local file is at seq {self.first_seq}"
                )
            return (
                f"anchors_disagree: the local anchor at seq {self.first_seq} is not the one"
                " the anchor mirror holds: the file was rewritten; treat it as tampering"
            )
        span = (
            f"event {self.first_seq}"
            if self.first_seq == self.last_seq
            else f"events {self.first_seq}..{self.last_seq}"
        )
        return f"{self.kind}: {span} {_PROBLEM_TEXT[self.kind]}"


@dataclass(frozen=True)
class Verification:
    """The result of checking the chain against its key and its newest signed anchor."""

    ok: bool
    count: int
    first_bad_seq: int | None
    anchored_seq: int | None = None
    problems: tuple[Problem, ...] = ()


@dataclass
class _Findings:
    problems: list[Problem] = field(default_factory=list)

    def add(self, kind: ProblemKind, first_seq: int, last_seq: int) -> None:
        last = self.problems[-1] if self.problems else None
        if last is not None and last.kind == kind and last.last_seq + 1 >= first_seq:
            self.problems[-1] = Problem(kind, last.first_seq, max(last.last_seq, last_seq))
        elif len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(Problem(kind, first_seq, last_seq))


def _valid_anchor(line: Anchor | None, settings: Settings) -> Anchor | None:
    keys = trusted_public_keys(settings)
    return line if line is not None and signed_by_any(line, keys) else None


def _read_anchors(anchors: AnchorLog, settings: Settings) -> tuple[Anchor | None, Anchor | None]:
    """The oldest and newest anchors, each None when missing, unreadable or not signed by us."""
    try:
        return _valid_anchor(anchors.first(), settings), _valid_anchor(anchors.newest(), settings)
    except ValueError:
        return None, None


def _against_mirror(
    newest: Anchor | None, settings: Settings, findings: _Findings
) -> Anchor | None:
    """Check the local newest anchor against the mirror; the newer of the two counts.

    A mirror holding a newer signed anchor means the local file was cut back (events after
    it may be gone unseen), and one holding another anchor for the same seq means it was
    rewritten: both are named. Without a mirror, `newest` as it is.
    """
    try:
        mirror = mirror_for(settings)
    except MirrorSettingError as exc:
        log.error("the audit anchor mirror is misconfigured: %s", exc)
        findings.add("anchors_disagree", max(newest.seq if newest else 0, 1), 0)
        return newest
    if mirror is None:
        return newest
    keys = trusted_public_keys(settings)
    try:
        mirrored = mirror.newest(lambda a: signed_by_any(a, keys))
    except OSError:
        mirrored = None
    if mirrored is None:
        if newest is not None and newest.seq > 0:
            findings.add("anchors_disagree", newest.seq, newest.seq - 1)
        return newest
    local_seq = newest.seq if newest is not None else -1
    if mirrored.seq > local_seq:
        findings.add("anchors_disagree", max(local_seq, 0), mirrored.seq)
        return mirrored
    if newest is not None:
        try:
            copy = mirror.get(newest.seq)
        except OSError:  # gone between the two reads: as unreadable
            findings.add("anchors_disagree", max(newest.seq, 1), 0)
            return newest
        if copy is not None and copy != newest:
            findings.add("anchors_disagree", newest.seq, newest.seq)
            return copy
    return newest


def verify(db: Session, *, settings: Settings) -> Verification:
    """Check every event's keyed hash and link, and the table against the newest anchor."""
    key = subkey(settings, Purpose.audit_chain)
    first, newest = _read_anchors(AnchorLog.for_settings(settings), settings)
    findings = _Findings()
    newest = _against_mirror(newest, settings, findings)
    legacy_through = newest.legacy_through if newest is not None else 0
    anchored_seq = newest.seq if newest is not None else 0
    # the oldest anchor pins the head of the unkeyed legacy events, the newest one the tail
    pinned = {a.seq: a.hash for a in (first, newest) if a is not None and a.seq > 0}
    expected_seq, prev_hash, count = 1, GENESIS_HASH, 0
    rows: Iterator[AuditEvent] = db.scalars(
        select(AuditEvent).order_by(AuditEvent.seq).execution_options(yield_per=1000)
    )
    for event in rows:
        count += 1
        if event.seq != expected_seq:
            findings.add("removed", expected_seq, event.seq - 1)
            prev_hash = event.prev_hash  # the gap is reported; check what follows on its own
        if event.seq <= legacy_through:
            computed = legacy_chain_hash(prev_hash, event)
        else:
            computed = chain_hash(key, prev_hash, event)
        unkeyed = event.prev_hash != prev_hash or computed != event.hash
        if unkeyed or pinned.get(event.seq, event.hash) != event.hash:
            kind: ProblemKind = "rewritten" if event.seq <= anchored_seq else "forged"
            findings.add(kind, event.seq, event.seq)
        prev_hash, expected_seq = event.hash, event.seq + 1
    if newest is None:
        findings.add("unanchored", 1, max(expected_seq - 1, 1))
    elif expected_seq <= newest.seq:
        findings.add("tail_deleted", expected_seq, newest.seq)
    problems = tuple(findings.problems)
    return Verification(
        ok=not problems,
        count=count,
        first_bad_seq=min((p.first_seq for p in problems), default=None),
        anchored_seq=newest.seq if newest is not None else None,
        problems=problems,
    )


def _legacy_head(db: Session) -> tuple[int, str]:
    """The last event of the unkeyed sha256 chain an older deployment left, or (0, genesis)."""
    seq, head = 0, GENESIS_HASH
    for event in db.scalars(
        select(AuditEvent).order_by(AuditEvent.seq).execution_options(yield_per=1000)
    ):
        if event.seq != seq + 1 or legacy_chain_hash(head, event) != event.hash:
            break
        seq, head = event.seq, event.hash
    return seq, head


class AnchorsMissing(Exception):
    """The anchor file is gone (or holds no anchor) while the table holds events."""


class AnchorsDisagree(AnchorsMissing):
    """The anchor mirror holds a newer or a different anchor than the local file."""


# The newest seq this process has seen in each mirror: after the first pass the anchorer
# compares against it instead of listing the mirror every interval (a folder of one file per
# anchor grows without end). Read and written under the anchor file's lock.
_mirror_high: dict[str, int] = {}


def _check_mirror(mirror: Mirror, newest: Anchor | None, keys: list[Ed25519PublicKey]) -> None:
    """Refuse to anchor over a local file that the mirror shows was cut back or rewritten."""
    high = _mirror_high.get(mirror.where)
    if high is None:
        try:
            mirrored = mirror.newest(lambda a: signed_by_any(a, keys))
        except OSError as exc:
            log.error("the audit anchor mirror %s cannot be read: %s", mirror.where, exc)
            return  # anchoring goes on locally; verify names the mirror's absence
        high = mirrored.seq if mirrored is not None else -1
    local = newest.seq if newest is not None else -1
    if high > local:
        raise AnchorsDisagree(
            f"the anchor mirror {mirror.where} holds a signed anchor at seq {high} but"
            f" the local anchor file ends at seq {newest.seq if newest else 'nothing'}: it was"
            " cut back; restore it from the mirror (nothing is signed until then)"
        )
    _mirror_high[mirror.where] = high
    if newest is None:
        return
    try:
        copy = mirror.get(newest.seq)
    except OSError as exc:
        log.error("the audit anchor mirror %s cannot be read: %s", mirror.where, exc)
        return  # as above: anchoring goes on locally, verify names it
    if copy is not None and copy != newest:
        raise AnchorsDisagree(
            f"the local anchor at seq {newest.seq} differs from the anchor mirror's copy: the"
            " file was rewritten; restore it from the mirror (nothing is signed until then)"
        )


def _push(mirror: Mirror | None, anchor: Anchor) -> None:
    """Copy `anchor` to the mirror; an unreachable mirror is logged and retried next pass."""
    if mirror is None:
        return
    try:
        mirror.push(anchor)
        _mirror_high[mirror.where] = max(_mirror_high.get(mirror.where, -1), anchor.seq)
    except MirrorConflict as exc:
        raise AnchorsDisagree(f"{exc}: the local anchor file was rewritten") from exc
    except OSError as exc:
        log.error("audit anchor %d not copied to the mirror %s: %s", anchor.seq, mirror.where, exc)


def anchor_head(db: Session, *, settings: Settings, adopt: bool = False) -> Anchor | None:
    """Sign the chain's head into the anchor file if it moved; returns the newest anchor.

    Only a head that extends the last anchor through events carrying the platform's keyed
    hash is signed: a cut tail or a forged event is never made to look anchored.

    With no anchor file, only an empty table is anchored (seq 0, a new deployment) unless
    `adopt` (`nebula audit adopt`, an operator's decision): otherwise AnchorsMissing. A
    lost or emptied file is never silently replaced, since whoever rewrote the events as
    an unkeyed chain would then have them signed (issue 27, finding 6).
    """
    key = subkey(settings, Purpose.audit_chain)
    signer = anchor_signing_key(settings)
    keys = trusted_public_keys(settings)
    anchors = AnchorLog.for_settings(settings)
    mirror = mirror_for(settings)
    with anchors.locked():
        newest = anchors.newest()
        if mirror is not None:
            _check_mirror(mirror, newest, keys)
        if newest is None and not adopt:
            events = db.scalar(select(func.count()).select_from(AuditEvent)) or 0
            if events:
                raise AnchorsMissing(
                    f"the audit anchor file {anchors.path} is missing or holds no anchor, and"
                    f" the audit table holds {events} events: restore the file from its backup."
                    " Only for an upgrade from a release without the keyed chain, run"
                    " `nebula audit adopt` once."
                )
        if newest is None:
            # the first anchor of this deployment: events an older release chained without
            # the key are kept as they are, and their head is pinned by this signature
            legacy_through, head = _legacy_head(db)
            seq = legacy_through
            if legacy_through:
                log.warning("audit events 1..%d predate the keyed chain; anchored as they are", seq)
        elif not signed_by_any(newest, keys):
            log.error("the newest audit anchor is not signed by this control plane; not anchoring")
            return None
        else:
            legacy_through, seq, head = newest.legacy_through, newest.seq, newest.hash
            stored = db.scalar(select(AuditEvent.hash).where(AuditEvent.seq == seq))
            if seq and stored != head:
                log.error("audit event %d differs from its anchor; not anchoring (verify it)", seq)
                return newest
        for event in db.scalars(
            select(AuditEvent)
            .where(AuditEvent.seq > seq)
            .order_by(AuditEvent.seq)
            .execution_options(yield_per=1000)
        ):
            if (
                event.seq != seq + 1
                or event.prev_hash != head
                or chain_hash(key, head, event) != event.hash
            ):
                log.error("audit event %d is not the platform's; not anchored", event.seq)
                break
            seq, head = event.seq, event.hash
        if newest is not None and seq == newest.seq:
            _push(mirror, newest)  # a mirror configured later, or one that was unreachable
            return newest
        anchor = sign(signer, seq=seq, hash=head, legacy_through=legacy_through, at=utcnow())
        anchors.append(anchor)
        _push(mirror, anchor)
        return anchor


def newest_anchor(*, settings: Settings) -> Anchor:
    """The newest signed head kept outside the database."""
    _first, newest = _read_anchors(AnchorLog.for_settings(settings), settings)
    if newest is None:
        raise NotFound("no signed anchor yet")
    return newest


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
    page: Page,
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
    items = db.scalars(
        stmt.order_by(AuditEvent.seq.desc()).limit(page.limit).offset(page.offset)
    ).all()
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
        # nothing held between batches, while the client reads; the batch stays loaded
        commit_before_waiting(db)
        db.expunge_all()
        if not events:
            return
        yield from events
        last_seq = events[-1].seq
