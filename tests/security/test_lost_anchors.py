"""Losing the signed heads file must not turn a rewritten audit log into a verified one.

Issue 27, finding 6: rewrite event 3, recompute the whole chain as plain sha256 (the
form events took before the keyed chain), delete `anchors.jsonl`. The anchorer used to
take that for pre-upgrade history and sign it. Now, with events in the table and no
anchor file, it stops (nothing signed) and verify fails, loudly, until the file is
restored; only `nebula audit adopt`, an operator's decision, signs a chain without one.
"""

from __future__ import annotations

import re
import secrets
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select

from app.accounts.models import Role
from app.audit import service as audit
from app.audit.anchor import (
    Anchor,
    AnchorLog,
    AnchorMirror,
    MirrorConflict,
    anchor_signing_key,
    sign,
)
from app.audit.anchoring import Anchorer
from app.audit.mirrors import MirrorSettingError, mirror_for
from app.audit.models import AuditEvent
from app.audit.service import GENESIS_HASH, Actor
from app.settings import Settings
from support.certs import localhost_certificate
from support.platforms import Platform, anchor_now, cli_env, disable_audit_triggers
from support.processes import environment, serving

REPO = Path(__file__).resolve().parents[2]


def _events(platform: Platform, n: int = 6) -> None:
    with platform.factory() as db:
        for i in range(n):
            audit.record(db, actor=Actor("mallory"), action=f"workspace.create.{i}")
            db.commit()
    anchor_now(platform)


def _rewrite_in_legacy_form(platform: Platform, seq: int) -> None:
    """Change event `seq` and recompute every hash as an unkeyed sha256 chain."""
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        prev = GENESIS_HASH
        for event in db.scalars(select(AuditEvent).order_by(AuditEvent.seq)):
            if event.seq == seq:
                event.action = "nothing.happened"
            event.prev_hash = prev
            event.hash = prev = audit.legacy_chain_hash(prev, event)
            db.flush()
        db.commit()


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "audit", *args],
        env=cli_env(settings),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


@pytest.mark.parametrize("loss", ["deleted", "truncated"])
def test_a_legacy_form_rewrite_with_the_anchor_file_lost_fails_verify_until_restored(
    client: TestClient, platform: Platform, settings: Settings, loss: str
) -> None:
    _events(platform)
    anchors = AnchorLog.for_settings(settings)
    saved = anchors.path.read_bytes()
    _rewrite_in_legacy_form(platform, 3)
    if loss == "deleted":
        anchors.path.unlink()
    else:
        anchors.path.write_bytes(b"")

    anchorer = Anchorer(client.app.state.read_sessionmaker, settings)  # type: ignore[attr-defined]
    anchorer.anchor_once()
    assert anchorer.halted  # stopped: nothing was signed over the rewritten chain
    assert anchors.newest() is None
    with platform.factory() as db:
        with pytest.raises(audit.AnchorsMissing, match="restore the file"):
            audit.anchor_head(db, settings=settings)
        result = audit.verify(db, settings=settings)
    assert not result.ok
    kinds = {p.kind for p in result.problems}
    assert "unanchored" in kinds and "forged" in kinds, result.problems
    cli = _cli(settings, "verify")
    assert cli.returncode == 1 and "restore the anchor file" in cli.stdout, cli.stdout

    # the operator restores the file: anchoring resumes, and the rewrite is named
    anchors.path.write_bytes(saved)
    anchorer.anchor_once()
    assert not anchorer.halted
    with platform.factory() as db:
        result = audit.verify(db, settings=settings)
    assert not result.ok
    # every event was rehashed without the key: all of them, event 3 among them, are named
    assert any(p.kind == "rewritten" and p.first_seq <= 3 <= p.last_seq for p in result.problems)
    # adopting is refused while the file holds anchors
    assert _cli(settings, "adopt").returncode == 1


def test_a_new_deployment_anchors_its_empty_table_and_adopt_is_explicit(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    """The app anchors an empty table at its start (seq 0): the first events are covered."""
    first = AnchorLog.for_settings(settings).first()
    assert first is not None and first.seq == 0
    _events(platform, 2)
    with platform.factory() as db:
        assert audit.verify(db, settings=settings).ok


def _mirrored(settings: Settings, tmp_path: Path) -> Path:
    mirror = tmp_path / "mirror"  # stands for a folder on another host's write-once share
    mirror.mkdir()
    settings.audit_anchor_mirror = str(mirror)
    return mirror


def _anchored_twice(
    platform: Platform, settings: Settings
) -> tuple[AnchorLog, Anchor, bytes, Anchor]:
    """Events anchored, then more: (the anchor file, the older anchor, the file as it was
    then, the newest anchor)."""
    _events(platform, 3)
    anchors = AnchorLog.for_settings(settings)
    older = anchors.newest()
    assert older is not None
    saved = anchors.path.read_bytes()
    _events(platform, 3)
    newest = anchors.newest()
    assert newest is not None and newest.seq > older.seq
    return anchors, older, saved, newest


def _cut_back(platform: Platform, anchors: AnchorLog, older: Anchor, saved: bytes) -> None:
    """Delete the events after `older` and put the anchor file back as it was then."""
    disable_audit_triggers(platform.factory)
    with platform.factory() as db:
        db.execute(delete(AuditEvent).where(AuditEvent.seq > older.seq))
        db.commit()
    anchors.path.write_bytes(saved)


def test_a_file_cut_back_to_an_older_anchor_fails_verify_against_the_mirror(
    client: TestClient, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    """Delete the newest events, cut the file back to an older anchor: the mirror names it."""
    mirror = _mirrored(settings, tmp_path)
    anchors, older, saved, newest = _anchored_twice(platform, settings)
    assert AnchorMirror(mirror).get(newest.seq) == newest  # pushed as it was signed
    assert (mirror / f"{newest.seq:012d}.json").stat().st_mode & 0o222 == 0
    _cut_back(platform, anchors, older, saved)

    with platform.factory() as db:
        result = audit.verify(db, settings=settings)
    assert not result.ok
    found = {(p.kind, p.first_seq, p.last_seq) for p in result.problems}
    assert ("anchors_disagree", older.seq, newest.seq) in found, result.problems
    assert ("tail_deleted", older.seq + 1, newest.seq) in found, result.problems
    env = cli_env(settings) | {"NEBULA_AUDIT_ANCHOR_MIRROR": str(mirror)}
    cli = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "verify"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert cli.returncode == 1 and "was cut back" in cli.stdout, cli.stdout
    # without the mirror the cut is invisible: that is what the mirror is for
    assert _cli(settings, "verify").returncode == 0

    # the anchorer stops rather than sign over the cut
    anchorer = Anchorer(client.app.state.read_sessionmaker, settings)  # type: ignore[attr-defined]
    anchorer.anchor_once()
    assert anchorer.halted
    with platform.factory() as db, pytest.raises(audit.AnchorsDisagree, match="cut back"):
        audit.anchor_head(db, settings=settings)
    # a process started after the cut (nothing remembered) lists the mirror and stops too
    audit._mirror_high.clear()
    with platform.factory() as db, pytest.raises(audit.AnchorsDisagree, match="cut back"):
        audit.anchor_head(db, settings=settings)
    assert anchors.newest() == older


def _resigned(settings: Settings, anchor: Anchor) -> Anchor:
    """Another anchor for `anchor`'s seq, signed with the platform's key over another hash."""
    return sign(
        anchor_signing_key(settings),
        seq=anchor.seq,
        hash="0" * 64,
        legacy_through=anchor.legacy_through,
        at=anchor.signed_at,
    )


def test_a_rewritten_local_anchor_differs_from_the_mirror_and_the_mirror_is_write_once(
    client: TestClient, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    mirror = _mirrored(settings, tmp_path)
    _events(platform, 3)
    anchors = AnchorLog.for_settings(settings)
    newest = anchors.newest()
    assert newest is not None
    # someone with the signing key re-signs the same seq (say, over a rewritten event)
    forged = _resigned(settings, newest)
    with pytest.raises(MirrorConflict):
        AnchorMirror(mirror).push(forged)  # the writer never replaces a mirrored anchor
    lines = anchors.path.read_bytes().splitlines(keepends=True)
    anchors.path.write_bytes(b"".join(lines[:-1]) + forged.to_line())
    with platform.factory() as db:
        result = audit.verify(db, settings=settings)
    assert not result.ok
    assert any(
        p.kind == "anchors_disagree" and p.first_seq == p.last_seq == newest.seq
        for p in result.problems
    ), result.problems
    assert any("was rewritten" in p.detail for p in result.problems)


@contextmanager
def _mirror_server(folder: Path, token: str) -> Iterator[tuple[str, Path]]:
    """`nebula audit mirror-serve` over TLS as a second host runs it: (its URL, its CA)."""
    folder.mkdir(exist_ok=True)
    ca, cert, key = localhost_certificate(folder, "mirror")
    token_file = folder / "writer.token"
    token_file.write_text(token)
    argv = [
        *("-m", "cli", "audit", "mirror-serve", "--dir", str(folder / "anchors")),
        *("--token-file", str(token_file), "--port", "0", "--cert", str(cert), "--key", str(key)),
    ]

    def port(log: Path) -> str | None:
        found = re.search(r"anchor mirror on https://127\.0\.0\.1:(\d+)", log.read_text())
        return found.group(1) if found else None

    log = folder / "mirror.log"
    with serving(
        [sys.executable, *argv], log, env=environment(), ready=port, what="the mirror", timeout=60
    ):
        yield f"https://localhost:{port(log)}", ca


def _mirrored_over_https(settings: Settings, url: str, ca: Path, token: str, folder: Path) -> None:
    token_file = folder / "control-plane.token"
    token_file.write_text(token)
    settings.audit_anchor_mirror = url
    settings.audit_anchor_mirror_token_file = token_file
    settings.audit_anchor_mirror_ca = ca
    audit._mirror_high.clear()


def test_an_https_mirror_on_a_second_server_finds_a_cut_back_file_and_refuses_overwrites(
    client: TestClient, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    token = secrets.token_hex(32)
    admin = platform.user(role=Role.admin)  # signed in before the cut: no event after it
    with _mirror_server(tmp_path / "second-host", token) as (url, ca):
        _mirrored_over_https(settings, url, ca, token, tmp_path)
        tls = ssl.create_default_context(cafile=str(ca))
        anchors, older, saved, newest = _anchored_twice(platform, settings)
        # pushed as signed, readable by anyone (an auditor needs no platform credential)
        read = httpx.get(f"{url}/anchors/{newest.seq}", verify=tls)
        assert read.status_code == 200 and Anchor.from_line(read.content) == newest
        assert httpx.get(f"{url}/anchors", verify=tls).json()["seqs"][0] == newest.seq

        # write-once: no token 401, another anchor for a seq it holds 409, the same one 200
        forged = _resigned(settings, newest)
        put = f"{url}/anchors/{newest.seq}"
        assert httpx.put(put, content=forged.to_line(), verify=tls).status_code == 401
        writer = {"Authorization": f"Bearer {token}"}
        over = httpx.put(put, content=forged.to_line(), headers=writer, verify=tls)
        assert over.status_code == 409, over.text
        same = httpx.put(put, content=newest.to_line(), headers=writer, verify=tls)
        assert same.status_code == 200, same.text
        with pytest.raises(MirrorConflict):
            mirror_for(settings).push(forged)  # type: ignore[union-attr]

        # delete the newest events and cut the local file back to the older anchor
        _cut_back(platform, anchors, older, saved)
        env = cli_env(settings) | {
            "NEBULA_AUDIT_ANCHOR_MIRROR": url,
            "NEBULA_AUDIT_ANCHOR_MIRROR_TOKEN_FILE": str(settings.audit_anchor_mirror_token_file),
            "NEBULA_AUDIT_ANCHOR_MIRROR_CA": str(ca),
        }
        verify = [sys.executable, "-m", "cli", "audit", "verify"]
        cli = subprocess.run(verify, env=env, capture_output=True, text=True, cwd=REPO, timeout=120)
        assert cli.returncode == 1 and "was cut back" in cli.stdout, cli.stdout
        assert f"seq {newest.seq}" in cli.stdout
        # without the mirror the cut is invisible: that is what the mirror is for
        assert _cli(settings, "verify").returncode == 0
        # the admin's endpoint says so too, and the anchorer signs nothing over the cut
        answer = client.get("/api/v1/audit/verify", headers=admin.headers).json()
        assert answer["ok"] is False, answer
        anchorer = Anchorer(client.app.state.read_sessionmaker, settings)  # type: ignore[attr-defined]
        anchorer.anchor_once()
        assert anchorer.halted

        # the operator restores the file from the mirror: the cut is named as tail_deleted
        anchors.path.write_bytes(
            b"".join(
                mirror_for(settings).get(seq).to_line()  # type: ignore[union-attr]
                for seq in sorted(mirror_for(settings).seqs())  # type: ignore[union-attr]
            )
        )
        with platform.factory() as db:
            result = audit.verify(db, settings=settings)
        assert {p.kind for p in result.problems} == {"tail_deleted"}, result.problems

    # the mirror gone: verify fails rather than trust the local file alone
    audit._mirror_high.clear()
    cli = subprocess.run(verify, env=env, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert cli.returncode == 1 and "cannot be read" in cli.stdout, cli.stdout


def test_an_http_mirror_off_loopback_is_refused_and_a_url_needs_its_token(
    settings: Settings, tmp_path: Path
) -> None:
    settings.audit_anchor_mirror = "http://mirror.example.org:8470"
    settings.audit_anchor_mirror_token_file = tmp_path / "token"
    (tmp_path / "token").write_text("t" * 64)
    with pytest.raises(MirrorSettingError, match="refusing plain http"):
        mirror_for(settings)
    settings.audit_anchor_mirror = "https://mirror.example.org:8470"
    settings.audit_anchor_mirror_token_file = None
    with pytest.raises(MirrorSettingError, match="TOKEN_FILE"):
        mirror_for(settings)
