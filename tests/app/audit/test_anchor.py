"""The anchor file, the anchorer, and audit events left by a release before the keyed chain."""

from __future__ import annotations

import os
import stat
import threading
from datetime import UTC, datetime
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select, text

from app.audit import service as audit
from app.audit.anchor import Anchor, AnchorLog, anchor_signing_key, sign
from app.audit.anchoring import Anchorer
from app.audit.models import AuditEvent
from app.audit.service import GENESIS_HASH, Actor
from app.db import make_engine, make_sessionmaker
from app.keyring import Purpose, subkey
from app.main import create_app
from app.settings import Settings
from support.platforms import Platform, disable_audit_triggers


def test_newest_skips_a_torn_last_line_and_reads_across_blocks(
    tmp_path: Path, settings: Settings
) -> None:
    log = AnchorLog(tmp_path / "anchors.jsonl")
    assert log.newest() is None and log.first() is None
    key = anchor_signing_key(settings)
    at = datetime.now(UTC)
    with log.locked():
        for seq in range(1, 40):  # ~9 KiB: the tail is read in more than one block
            log.append(sign(key, seq=seq, hash=f"{seq:064x}", legacy_through=0, at=at))
    with log.path.open("ab") as f:
        f.write(b'{"seq": 99, "hash"')  # a crash in the middle of a write
    newest, first = log.newest(), log.first()
    assert newest is not None and first is not None
    assert (first.seq, newest.seq) == (1, 39)
    mode = os.stat(log.path).st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_the_app_anchors_at_start_and_within_an_interval(
    client: TestClient, platform: Platform
) -> None:
    log = AnchorLog.for_settings(platform.settings)
    started = log.newest()
    assert started is not None  # written before the first request
    assert stat.S_IMODE(os.stat(log.path.parent).st_mode) == 0o700
    with platform.factory() as db:
        event = audit.record(db, actor=Actor(None), action="test.anchor")
        db.commit()
    anchorer = Anchorer(platform.factory, platform.settings)
    anchorer.anchor_once()
    newest = log.newest()
    assert newest is not None and (newest.seq, newest.hash) == (event.seq, event.hash)
    anchorer.anchor_once()  # nothing new: nothing written
    assert log.path.read_bytes().count(b"\n") == 2


def test_concurrent_anchorers_append_whole_increasing_lines(
    client: TestClient, platform: Platform
) -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                with platform.factory() as db:
                    audit.record(db, actor=Actor(None), action="test.concurrent")
                    db.commit()
                Anchorer(platform.factory, platform.settings).anchor_once()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    lines = AnchorLog.for_settings(platform.settings).path.read_bytes().splitlines()
    seqs = [Anchor.from_line(line).seq for line in lines]
    assert seqs == sorted(set(seqs))
    with platform.factory() as db:
        assert audit.verify(db, settings=platform.settings).ok


def test_the_anchorer_does_not_sign_over_a_cut_tail(client: TestClient, platform: Platform) -> None:
    with platform.factory() as db:
        for _ in range(3):
            audit.record(db, actor=Actor(None), action="test.cut")
        db.commit()
    anchorer = Anchorer(platform.factory, platform.settings)
    anchorer.anchor_once()
    log = AnchorLog.for_settings(platform.settings)
    before = log.newest()
    assert before is not None
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        db.execute(text("DELETE FROM audit_events WHERE seq >= :s"), {"s": before.seq - 1})
        db.commit()
        for _ in range(3):  # the chain grows past the anchor again, with other events
            audit.record(db, actor=Actor(None), action="test.after-cut")
        db.commit()
    anchorer.anchor_once()
    assert log.newest() == before
    with platform.factory() as db:
        problems = audit.verify(db, settings=platform.settings).problems
    # the event now at the anchored seq is not the one that was anchored
    assert [(p.kind, p.first_seq) for p in problems] == [("rewritten", before.seq)]


def _legacy_events(settings: Settings, n: int) -> None:
    """What a release before the keyed chain left: sha256-chained events, no anchor file."""
    engine = make_engine(settings.resolved_database_url)
    with make_sessionmaker(engine)() as db:
        prev = GENESIS_HASH
        for seq in range(1, n + 1):
            event = AuditEvent(
                seq=seq,
                at=datetime.now(UTC),
                actor_id=None,
                action="user.create",
                outcome="success",
                details={"n": seq},
                prev_hash=prev,
            )
            event.hash = prev = audit.legacy_chain_hash(prev, event)
            db.add(event)
        db.commit()
    engine.dispose()


def test_an_older_deployment_keeps_its_events_and_pins_their_head(settings: Settings) -> None:
    _legacy_events(settings, 4)
    # what `nebula audit adopt` does, once, by the operator's decision: without it the
    # anchorer refuses a table with events and no anchor file (tests/security/test_lost_anchors.py)
    engine = audit.use_chain_key(make_engine(settings.resolved_database_url), settings)
    with make_sessionmaker(engine)() as db:
        audit.anchor_head(db, settings=settings, adopt=True)
    engine.dispose()
    app = create_app(settings)
    with TestClient(app):
        first = AnchorLog.for_settings(settings).first()
        assert first is not None and (first.seq, first.legacy_through) == (4, 4)
        factory = app.state.sessionmaker
        with factory() as db:
            audit.record(db, actor=Actor(None), action="test.keyed")
            db.commit()
            result = audit.verify(db, settings=settings)
            assert result.ok and result.count >= 5
            keyed = db.scalars(select(AuditEvent).where(AuditEvent.seq == 5)).one()
            key = subkey(settings, Purpose.audit_chain)
            assert keyed.hash == audit.chain_hash(key, keyed.prev_hash, keyed)  # keyed from now
        # rewriting the unkeyed part, even recomputing it with sha256, moves its pinned head
        disable_audit_triggers(factory)
        with factory() as db:
            prev = GENESIS_HASH
            for event in db.scalars(select(AuditEvent).where(AuditEvent.seq <= 4).order_by("seq")):
                event.details = {"n": 0}
                event.prev_hash = prev
                event.hash = prev = audit.legacy_chain_hash(prev, event)
                db.flush()
            db.commit()
            problems = audit.verify(db, settings=settings).problems
        assert ("rewritten", 4) in [(p.kind, p.first_seq) for p in problems]
    app.state.engine.dispose()
