"""The anchor signing key is a key file of its own, not derivable from the platform secret.

Issue 27, finding 6: whoever held the platform secret could derive the key that signs the
audit anchors and so sign any head. Now the key lives in its own file (0600, made by
`nebula audit anchor-key create` or, on a single host, at first start), and a deployment
whose anchors were signed by the derived key keeps them verifiable by listing that key's
public half while new anchors are signed with the file's key.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.audit import service as audit
from app.audit.anchor import (
    AnchorKeyError,
    AnchorLog,
    anchor_key_path,
    anchor_signing_key,
    derived_anchor_key,
    public_key_b64,
    sign,
    signature_holds,
)
from app.audit.models import AuditEvent
from app.audit.service import Actor
from app.db import utcnow
from app.settings import Settings
from support.platforms import Platform, anchor_now, cli_env

REPO = Path(__file__).resolve().parents[2]


def _public(settings: Settings) -> str:
    return public_key_b64(anchor_signing_key(settings).public_key())


def test_the_default_key_is_made_once_0600_and_is_not_derived_from_the_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one = Settings(var_dir=tmp_path / "one", secret_key="the-same-secret")  # type: ignore[arg-type]
    two = Settings(var_dir=tmp_path / "two", secret_key="the-same-secret")  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="nebula.audit"):
        first = _public(one)
    assert "on this host" in caplog.text
    path = anchor_key_path(one)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert _public(one) == first  # read back, never replaced
    # the same secret gives another key elsewhere, and neither is the derived one
    assert _public(two) != first
    assert public_key_b64(derived_anchor_key(one).public_key()) not in {first, _public(two)}


def test_a_configured_key_file_must_exist_and_be_private(tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "anchor.pem"
    settings = Settings(
        var_dir=tmp_path / "var",
        secret_key="s",  # type: ignore[arg-type]
        audit_anchor_key_file=key_file,
    )
    with pytest.raises(AnchorKeyError, match="anchor-key create"):
        anchor_signing_key(settings)
    assert not anchor_key_path(Settings(var_dir=tmp_path / "var")).exists()  # none made

    env = {"NEBULA_VAR_DIR": str(tmp_path / "var"), "PATH": os.environ.get("PATH", "")}
    made = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "anchor-key", "create", "--out", str(key_file)],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert f"public key: {_public(settings)}" in made.stdout
    again = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "anchor-key", "create", "--out", str(key_file)],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert again.returncode == 1 and "never replaced" in again.stderr

    os.chmod(key_file, 0o640)
    with pytest.raises(AnchorKeyError, match="readable by others"):
        anchor_signing_key(settings)


def test_anchors_signed_by_the_derived_key_verify_once_its_public_key_is_listed(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    """A deployment from before the key file: its anchors were signed by the derived key."""
    with platform.factory() as db:
        for i in range(3):
            audit.record(db, actor=Actor("alice"), action=f"workspace.create.{i}")
            db.commit()
        head = db.scalars(select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)).one()
    derived = derived_anchor_key(settings)
    anchors = AnchorLog.for_settings(settings)
    with anchors.locked():  # the app's anchorer waits meanwhile
        anchors.path.write_bytes(b"")
        anchors.append(sign(derived, seq=0, hash=audit.GENESIS_HASH, legacy_through=0, at=utcnow()))
        anchors.append(sign(derived, seq=head.seq, hash=head.hash, legacy_through=0, at=utcnow()))

    # the derived key is not trusted by itself: its anchors do not count
    with platform.factory() as db:
        result = audit.verify(db, settings=settings)
    assert not result.ok and {p.kind for p in result.problems} == {"unanchored"}
    env = cli_env(settings)
    listed = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "anchor-key", "derived-public"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    settings.audit_anchor_public_keys = listed.stdout.strip()
    missing = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "verify"],
        env=env | {"NEBULA_AUDIT_ANCHOR_KEY_FILE": str(settings.var_dir / "no-such-key.pem")},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert missing.returncode == 1 and "anchor-key create" in missing.stdout, missing.stdout

    with platform.factory() as db:
        assert audit.verify(db, settings=settings).ok
        audit.record(db, actor=Actor("alice"), action="workspace.create.after")
        db.commit()
    newest = anchor_now(platform)
    assert newest.seq == head.seq + 1
    assert signature_holds(newest, anchor_signing_key(settings).public_key())
    assert not signature_holds(newest, derived.public_key())
    with platform.factory() as db:
        assert audit.verify(db, settings=settings).ok
