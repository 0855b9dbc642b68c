"""The audit hash chain: gap-free under concurrency, tamper-evident, append-only."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from app.accounts.models import Role
from app.audit import service as audit
from app.audit.models import AuditEvent
from app.audit.service import Actor
from app.settings import Settings
from support.platforms import Platform, anchor_now, cli_env, disable_audit_triggers


def _seed(client: TestClient, platform: Platform, n: int = 6) -> None:
    alice = platform.user()
    for i in range(n):
        client.post("/api/v1/workspaces", json={"name": f"w{i}"}, headers=alice.headers)


def test_twenty_concurrent_writers_leave_a_gap_free_verifying_chain(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    owner = platform.user()
    errors: list[BaseException] = []
    barrier = threading.Barrier(20)

    def write(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            for j in range(3):
                with platform.factory() as db:
                    audit.record(
                        db, actor=Actor(owner.id), action="test.write", subject_id=f"{i}-{j}"
                    )
                    db.commit()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with platform.factory() as db:
        seqs = db.scalars(select(AuditEvent.seq).order_by(AuditEvent.seq)).all()
        result = audit.verify(db, settings=settings)
    assert seqs == list(range(1, len(seqs) + 1))
    assert result.ok and result.count == len(seqs)


def test_update_and_delete_are_refused_by_the_database(
    client: TestClient, platform: Platform
) -> None:
    _seed(client, platform, 1)
    with platform.factory() as db:
        with pytest.raises(DBAPIError):
            db.execute(text("UPDATE audit_events SET outcome = 'x'"))
        db.rollback()
        with pytest.raises(DBAPIError):
            db.execute(text("DELETE FROM audit_events"))
        db.rollback()


def test_an_altered_event_is_found(client: TestClient, platform: Platform) -> None:
    _seed(client, platform)
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        db.execute(text("UPDATE audit_events SET outcome = 'failure' WHERE seq = 4"))
        db.commit()
        assert audit.verify(db, settings=platform.settings).first_bad_seq == 4


def test_a_removed_event_is_found(client: TestClient, platform: Platform) -> None:
    _seed(client, platform)
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        db.execute(text("DELETE FROM audit_events WHERE seq = 5"))
        db.commit()
        result = audit.verify(db, settings=platform.settings)
    assert (result.ok, result.first_bad_seq) == (False, 5)
    assert [(p.kind, p.first_seq, p.last_seq) for p in result.problems] == [("removed", 5, 5)]


def test_an_inserted_event_is_found(client: TestClient, platform: Platform) -> None:
    _seed(client, platform)
    anchor_now(platform)
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        # make room at seq 3 and insert a forged event there
        last = db.scalar(select(AuditEvent.seq).order_by(AuditEvent.seq.desc()).limit(1))
        assert last is not None
        for seq in range(last, 2, -1):
            db.execute(
                text("UPDATE audit_events SET seq = :new WHERE seq = :old"),
                {"new": seq + 1, "old": seq},
            )
        prev = db.scalar(select(AuditEvent.hash).where(AuditEvent.seq == 2))
        forged = AuditEvent(
            seq=3,
            actor_id=None,
            action="user.create",
            outcome="success",
            details={},
            prev_hash=prev,
        )
        forged.at = db.scalar(select(AuditEvent.at).where(AuditEvent.seq == 2))
        # chained as well as one can without the key: the old, unkeyed hash
        forged.hash = audit.legacy_chain_hash(prev or "", forged)
        db.add(forged)
        db.commit()
        result = audit.verify(db, settings=platform.settings)
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert result.problems[0].kind == "rewritten"  # inside the anchored part of the chain


def test_verify_endpoint_and_cli_agree(
    client: TestClient, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    _seed(client, platform)
    auditor = platform.user(Role.auditor)
    anchor_now(platform)
    env = cli_env(settings)
    cli = [sys.executable, "-m", "cli", "audit", "verify"]
    ok = subprocess.run(cli, env=env, capture_output=True, text=True, cwd=Path(__file__).parents[3])
    assert ok.returncode == 0, ok.stderr
    assert client.get("/api/v1/audit/verify", headers=auditor.headers).json()["ok"] is True
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        db.execute(text("UPDATE audit_events SET details = '{\"x\": 1}' WHERE seq = 2"))
        db.commit()
    bad = subprocess.run(
        cli, env=env, capture_output=True, text=True, cwd=Path(__file__).parents[3]
    )
    assert bad.returncode == 1 and "seq 2" in bad.stdout
    answer = client.get("/api/v1/audit/verify", headers=auditor.headers).json()
    assert (answer["ok"], answer["first_bad_seq"]) == (False, 2)
    assert answer["problems"][0]["kind"] == "rewritten"


def test_export_streams_every_event_in_order(client: TestClient, platform: Platform) -> None:
    _seed(client, platform)
    auditor = platform.user(Role.auditor)
    jsonl = client.get("/api/v1/audit/export?format=jsonl", headers=auditor.headers)
    lines = jsonl.text.strip().splitlines()
    assert jsonl.status_code == 200 and len(lines) >= 8
    csv = client.get("/api/v1/audit/export?format=csv", headers=auditor.headers).text.splitlines()
    assert csv[0].startswith("id,seq,at,actor_id,action")
    assert client.get("/api/v1/audit/export?format=xml", headers=auditor.headers).status_code == 422


def test_audit_filters(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    alice = platform.user()
    client.post("/api/v1/workspaces", json={"name": "w"}, headers=alice.headers)
    events = client.get(
        f"/api/v1/audit?actor_id={alice.id}&action=workspace.create", headers=admin.headers
    ).json()
    assert events["total"] == 1 and events["items"][0]["actor_id"] == alice.id
    since = events["items"][0]["at"]
    later = client.get("/api/v1/audit", params={"since": since}, headers=admin.headers).json()
    assert all(e["at"] >= since for e in later["items"])
