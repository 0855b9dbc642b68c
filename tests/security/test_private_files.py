"""Finding 8 (issue 27): secrets are never written through a link someone planted.

A bundle, a switch's key, a worker credential: each is written to a temporary file made
with O_EXCL|O_NOFOLLOW under a random name, then renamed over the target. `nebula clusters
bundle --out` makes a new folder and refuses one that exists (or a link to one).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from common import private_files
from common.private_files import create_private_file, write_private_file
from support.clusters import register_clusters
from support.platforms import cli_env

SECRET = b"the-worker-credential"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of someone else's that a planted link points at."""
    path = tmp_path / "elsewhere" / "authorized_keys"
    path.parent.mkdir()
    path.write_bytes(b"untouched\n")
    return path


def _is_private_file(path: Path, data: bytes) -> bool:
    mode = os.lstat(path).st_mode
    return stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o600 and path.read_bytes() == data


def test_a_link_planted_at_the_old_temporary_name_is_not_followed(
    tmp_path: Path, victim: Path
) -> None:
    target = tmp_path / "bundle" / "credential"
    target.parent.mkdir()
    (target.parent / ".credential.tmp").symlink_to(victim)  # the name the old helper used
    write_private_file(target, SECRET)
    assert victim.read_bytes() == b"untouched\n"
    assert _is_private_file(target, SECRET)


def test_a_link_planted_at_the_target_is_replaced_not_followed(
    tmp_path: Path, victim: Path
) -> None:
    target = tmp_path / "credential"
    target.symlink_to(victim)
    write_private_file(target, SECRET)
    assert victim.read_bytes() == b"untouched\n"
    assert _is_private_file(target, SECRET)


def test_a_link_planted_at_the_temporary_name_refuses_the_write(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the name is random; here the attacker is granted a guess that comes true
    target = tmp_path / "credential"
    guessed = tmp_path / ".credential.guessed.tmp"
    guessed.symlink_to(victim)
    monkeypatch.setattr(private_files, "_temporary_name", lambda _target: guessed)
    with pytest.raises(FileExistsError):
        write_private_file(target, SECRET)
    assert victim.read_bytes() == b"untouched\n"
    assert not target.exists()
    assert guessed.is_symlink()  # left as found: never written through, never removed by us


def test_a_file_made_once_is_private_and_never_replaced(tmp_path: Path, victim: Path) -> None:
    target = tmp_path / "keys" / "secret_key"
    create_private_file(target, SECRET)
    assert _is_private_file(target, SECRET)
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    with pytest.raises(FileExistsError):
        create_private_file(target, b"another secret")
    assert target.read_bytes() == SECRET
    # a link planted where the file is to be made is something there: not followed
    planted = tmp_path / "planted"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        create_private_file(planted, SECRET)
    assert victim.read_bytes() == b"untouched\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_temporary_names_are_not_predictable(tmp_path: Path) -> None:
    target = tmp_path / "credential"
    names = {private_files._temporary_name(target).name for _ in range(50)}
    assert len(names) == 50


def _bundle(settings: Settings, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "clusters", "bundle", "cluster-a", "--out", str(out)],
        env=cli_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bundle_refuses_an_existing_folder_or_a_link_to_one(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    register_clusters(client.app.state.sessionmaker, settings, "cluster-a")  # type: ignore[attr-defined]
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    linked = tmp_path / "linked"
    linked.symlink_to(existing)
    for out in (existing, linked):
        refused = _bundle(settings, out)
        assert refused.returncode != 0
        assert f"{out} already exists" in refused.stderr
    assert list(existing.iterdir()) == []  # nothing written into it

    fresh = tmp_path / "fresh"
    written = _bundle(settings, fresh)
    assert written.returncode == 0, written.stderr
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700
    files = list(fresh.iterdir())
    assert files and all(stat.S_IMODE(os.lstat(f).st_mode) == 0o600 for f in files)
    assert not [f for f in files if f.name.endswith(".tmp")]
