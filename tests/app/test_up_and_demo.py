"""The embedded default: from a clean folder, `nebula up` and `nebula demo` succeed with no server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from support import NebulaUp

pytestmark = pytest.mark.slow


def test_nebula_up_then_demo_in_an_empty_folder(tmp_path: Path) -> None:
    with NebulaUp(tmp_path / "site") as up:
        assert httpx.get(f"{up.url}/readyz").json()["ready"] is True
        assert (tmp_path / "site" / "var" / "nebula.db").exists()  # SQLite, no database server
        assert (tmp_path / "site" / "var" / "broker").is_dir()  # the embedded broker
        demo = subprocess.run(
            up.command("demo", "--url", up.url, "--electra-steps", "4", "--abnet-steps", "2"),
            cwd=up.folder,
            env=up.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "BLEU on the test split" in demo.stdout
        assert "chain verified: True" in demo.stdout
        assert "bob downloading alice's raw text: 403" in demo.stdout
