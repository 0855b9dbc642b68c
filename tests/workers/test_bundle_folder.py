"""A bundle folder of the wrong owner or mode: the switch and the worker say which, and how
to fix it, before reading a secret out of it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.bundle import ClusterBundle
from workers.bundle import check_folder, load_bundle, write_bundle


@pytest.fixture
def bundle() -> Iterator[Path]:
    """A bundle as `nebula clusters bundle` writes it, under a folder others may traverse."""
    parent = Path(tempfile.mkdtemp(prefix="nebula-bundle-"))
    parent.chmod(0o755)
    folder = parent / "east"
    write_bundle(
        ClusterBundle(cluster="east", control_plane_url="https://cp", worker_credential="nbw_x"),
        folder,
        ca_pem=b"ca",
        control_plane_ca_pem=None,
    )
    yield folder
    shutil.rmtree(parent)


def test_a_bundle_as_written_loads(bundle: Path) -> None:
    assert load_bundle(bundle).cluster == "east"


def test_a_folder_others_may_read_is_refused_with_the_chmod(bundle: Path) -> None:
    bundle.chmod(0o755)
    with pytest.raises(SystemExit, match=rf"{bundle} has mode 0755.*chmod 0700 {bundle}"):
        load_bundle(bundle)
    bundle.chmod(0o700)
    (bundle / "bundle.json").chmod(0o644)
    with pytest.raises(SystemExit, match=r"bundle.json has mode 0644.*chmod 0600 .*bundle.json"):
        load_bundle(bundle)


def test_a_folder_copied_as_root_names_its_owner_and_the_chown(bundle: Path) -> None:
    # root copied it and kept it 0700: the service user cannot even look inside
    with pytest.raises(SystemExit) as refused:
        _check_as_nobody(bundle)
    assert str(refused.value) == (
        f"{bundle} belongs to root (mode 0700) and nobody cannot read it: "
        f"as root, chown -R nobody: {bundle} && chmod 0700 {bundle}"
    )
    # the folder was given over but a file in it was not
    os.chown(bundle, 65534, 65534)
    with pytest.raises(SystemExit) as refused:
        _check_as_nobody(bundle)
    assert str(refused.value) == (
        f"{bundle / 'bundle.json'} belongs to root, not to nobody who runs this: "
        f"as root, chown -R nobody: {bundle}"
    )
    for path in (bundle, *bundle.iterdir()):
        os.chown(path, 65534, 65534)
    _check_as_nobody(bundle)  # and now it is fine


def _check_as_nobody(folder: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    os.setegid(65534)
    os.seteuid(65534)
    try:
        check_folder(folder)
    finally:
        os.seteuid(0)
        os.setegid(0)
