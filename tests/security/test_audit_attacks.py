"""Attacks on the audit log by someone with rights over the database, each found.

The attacker may drop triggers and edit rows at will and knows the chain's algorithm;
they hold neither the platform secret nor the data directory where signed heads are kept.
Each attack must be named by `verify` and make `nebula audit verify` exit 1.
"""

from __future__ import annotations

import base64
import dataclasses
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi.testclient import TestClient
from sqlalchemy import delete, func, select, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from app.accounts.models import Role
from app.audit import service as audit
from app.audit.anchor import Anchor, signature_holds
from app.audit.models import AuditEvent
from app.audit.privileges import app_role_grants
from app.audit.service import Actor, Verification
from app.db import make_engine, make_sessionmaker
from app.settings import Settings
from support.platforms import Platform, anchor_now, cli_env, disable_audit_triggers

REPO = Path(__file__).resolve().parents[2]
# the events a cheat most wants gone (the review's example)
INCRIMINATING = ("access.revoke", "job.fail", "dataset.download")


def _history(platform: Platform, n: int = 9) -> int:
    """Nine more events, the incriminating ones at head+4..head+6, anchored; the old head."""
    with platform.factory() as db:
        base = db.scalar(select(func.max(AuditEvent.seq))) or 0
        for i in range(n):
            action = INCRIMINATING[i - 3] if 3 <= i < 6 else "workspace.create"
            audit.record(db, actor=Actor("mallory"), action=action)
            db.commit()
    assert anchor_now(platform).seq == base + n
    return base


def _verify(platform: Platform) -> Verification:
    with platform.factory() as db:
        return audit.verify(db, settings=platform.settings)


def _cli_verify(settings: Settings) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "audit", "verify"],
        env=cli_env(settings),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def _found(platform: Platform, kind: str, first_seq: int, last_seq: int) -> None:
    """verify and the CLI both name the attack."""
    result = _verify(platform)
    assert not result.ok
    assert (kind, first_seq, last_seq) in [
        (p.kind, p.first_seq, p.last_seq) for p in result.problems
    ]
    assert result.first_bad_seq == min(p.first_seq for p in result.problems)
    cli = _cli_verify(platform.settings)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert f"{kind}: " in cli.stdout


def test_an_untouched_chain_verifies_in_the_api_and_the_cli(
    client: TestClient, platform: Platform
) -> None:
    base = _history(platform)
    result = _verify(platform)
    assert result.ok and result.anchored_seq == result.count == base + 9
    cli = _cli_verify(platform.settings)
    assert cli.returncode == 0, cli.stdout + cli.stderr


def test_rewrite_and_recompute(client: TestClient, platform: Platform) -> None:
    """Delete the incriminating events, renumber, recompute every hash after them."""
    base = _history(platform)
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        db.execute(delete(AuditEvent).where(AuditEvent.action.in_(INCRIMINATING)))
        prev = db.scalar(select(AuditEvent.hash).where(AuditEvent.seq == base + 3))
        later = db.scalars(
            select(AuditEvent).where(AuditEvent.seq > base + 3).order_by(AuditEvent.seq)
        )
        for new_seq, event in enumerate(list(later), start=base + 4):
            event.seq = new_seq
            event.prev_hash = prev
            # the best an attacker without the key can do: the algorithm, with a guessed key
            event.hash = audit.chain_hash(b"guessed", prev or "", event)
            prev = event.hash
            db.flush()
        db.commit()
    assert _verify(platform).count == base + 6
    _found(platform, "rewritten", base + 4, base + 6)
    _found(platform, "tail_deleted", base + 7, base + 9)


def test_tail_deletion(client: TestClient, platform: Platform) -> None:
    """Delete the newest events: what remains is a perfect prefix of the chain."""
    base = _history(platform)
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        db.execute(delete(AuditEvent).where(AuditEvent.seq > base + 6))
        db.commit()
    _found(platform, "tail_deleted", base + 7, base + 9)


def test_forged_insert(client: TestClient, platform: Platform) -> None:
    """Append an event the platform never wrote, chained to the real head."""
    base = _history(platform)
    with platform.factory() as db:  # INSERT needs no trigger disabled
        head = db.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)).one()
        forged = AuditEvent(
            seq=head.seq + 1,
            at=head.at,
            actor_id=None,
            action="access.approve",
            outcome="success",
            details={},
            prev_hash=head.hash,
        )
        forged.hash = audit.legacy_chain_hash(head.hash, forged)
        db.add(forged)
        db.commit()
    anchored = anchor_now(platform)
    assert anchored.seq == base + 9  # the anchorer never signs a head over a forged event
    _found(platform, "forged", base + 10, base + 10)


def test_truncate(client: TestClient, platform: Platform) -> None:
    """TRUNCATE is refused; with the triggers dropped it empties the table, and is found."""
    base = _history(platform)
    with platform.factory() as db:
        if db.get_bind().dialect.name == "postgresql":
            with pytest.raises(DBAPIError, match="append-only"):
                db.execute(text("TRUNCATE audit_events"))
            db.rollback()
        with pytest.raises(DBAPIError, match="append-only"):
            db.execute(text("DELETE FROM audit_events"))  # SQLite's TRUNCATE
        db.rollback()
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        if db.get_bind().dialect.name == "postgresql":
            db.execute(text("TRUNCATE audit_events"))
        else:
            db.execute(text("DELETE FROM audit_events"))
        db.commit()
    assert _verify(platform).count == 0
    _found(platform, "tail_deleted", 1, base + 9)


def test_a_tampered_anchor_file_is_no_anchor(client: TestClient, platform: Platform) -> None:
    """A head written into the anchor file without the key is not believed."""
    base = _history(platform)
    anchor = anchor_now(platform)
    path = platform.settings.resolved_data_dir / "audit" / "anchors.jsonl"
    forged = Anchor(anchor.seq - 3, anchor.hash, 0, anchor.signed_at, anchor.signature)
    with path.open("ab") as f:
        f.write(forged.to_line())
    _found(platform, "unanchored", 1, base + 9)


def test_the_anchor_api_serves_the_signed_head(client: TestClient, platform: Platform) -> None:
    _history(platform)
    auditor, member = platform.user(Role.auditor), platform.user()
    anchor_now(platform)
    answer = client.get("/api/v1/audit/anchor", headers=auditor.headers)
    assert answer.status_code == 200
    body = answer.json()
    with platform.factory() as db:
        head = db.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)).one()
    assert (body["seq"], body["hash"]) == (head.seq, head.hash)
    # an outside party checks its copy with nothing but the public key
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(body["public_key"]))
    copy = Anchor(
        body["seq"],
        body["hash"],
        body["legacy_through"],
        datetime.fromisoformat(body["signed_at"]),
        body["signature"],
    )
    assert signature_holds(copy, public)
    assert not signature_holds(dataclasses.replace(copy, seq=copy.seq - 1), public)
    assert client.get("/api/v1/audit/anchor", headers=member.headers).status_code == 403


@pytest.fixture
def app_role(platform: Platform, settings: Settings) -> Iterator[str]:
    """A second PostgreSQL role with the documented grants, and the URL to connect as it."""
    role = f"nebula_app_{uuid.uuid4().hex[:8]}"
    owner = make_engine(settings.resolved_database_url).execution_options(
        isolation_level="AUTOCOMMIT"
    )
    with owner.connect() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        for statement in app_role_grants(role):
            conn.execute(text(statement))
    url = settings.resolved_database_url.replace("://postgres@", f"://{role}@")
    try:
        yield url
    finally:
        with owner.connect() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        owner.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # roles are PostgreSQL's
def test_the_app_role_may_only_insert_and_select(
    client: TestClient, platform: Platform, settings: Settings, app_role: str
) -> None:
    base = _history(platform, 2)
    engine = audit.use_chain_key(make_engine(app_role), settings)
    factory = make_sessionmaker(engine)
    try:
        with factory() as db:
            audit.record(db, actor=Actor(None), action="test.append")
            db.commit()
            assert (
                db.scalar(select(AuditEvent.action).where(AuditEvent.seq == base + 3))
                == "test.append"
            )
        for statement in (
            "UPDATE audit_events SET outcome = 'x'",
            "DELETE FROM audit_events",
            "TRUNCATE audit_events",
            "ALTER TABLE audit_events DISABLE TRIGGER USER",
        ):
            with factory() as db:
                with pytest.raises(ProgrammingError) as refused:
                    db.execute(text(statement))
                # refused by privileges, before any trigger is asked
                assert getattr(refused.value.orig, "sqlstate", None) == "42501", statement
    finally:
        engine.dispose()
    assert _verify(platform).ok
