"""The wheel carries the web UI: installed from it, the control plane serves `/` with no
Node and no source tree beside it (setup.py's build step)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INDEX = b"<!doctype html><title>Nebula test UI</title><div id=root></div>"


def _tree(tmp_path: Path, with_ui: bool) -> Path:
    """A copy of what a wheel is built from (the checkout, without its venv)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("app", "cli", "common", "contract", "workers", "migrations"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    if with_ui:
        (src / "frontend" / "dist" / "assets").mkdir(parents=True)
        (src / "frontend" / "dist" / "index.html").write_bytes(INDEX)
        (src / "frontend" / "dist" / "assets" / "app.js").write_text("console.log(1)")
    return src


def _wheel(src: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip


def test_the_wheel_serves_the_ui_without_node(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    built = _wheel(_tree(tmp_path, with_ui=True), out)
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("nebula-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert "app/static/index.html" in names and "app/static/assets/app.js" in names
        # and the migrations, for `nebula db upgrade` from the installed package
        assert "app/migrations/env.py" in names
        site = tmp_path / "site"
        archive.extractall(site)
    # the installed package alone (no checkout, no frontend/, no node on PATH) serves /
    script = (
        "from fastapi.testclient import TestClient\n"
        "from app.main import create_app\n"
        "from app.settings import Settings\n"
        f"s = Settings(var_dir={str(tmp_path / 'var')!r}, run_reaper=False)\n"
        "from app.migrate import upgrade\n"
        "upgrade(s.resolved_database_url)\n"
        "with TestClient(create_app(s)) as c:\n"
        "    r = c.get('/')\n"
        "    print(r.status_code, r.text)\n"
        "    print(c.get('/assets/app.js').status_code)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")}
    env.update(PYTHONPATH=str(site), PATH="/usr/bin:/bin")
    assert shutil.which("node", path=str(tmp_path)) is None
    served = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-3000:]
    first, second = served.stdout.strip().splitlines()[-2:]
    assert first == f"200 {INDEX.decode()}" and second == "200"


@pytest.mark.parametrize("allow", [False, True])
def test_a_wheel_without_the_built_ui_is_refused_unless_asked(tmp_path: Path, allow: bool) -> None:
    env = {"NEBULA_WHEEL_WITHOUT_UI": "1"} if allow else {}
    built = _wheel(_tree(tmp_path, with_ui=False), tmp_path / "wheels", **env)
    if allow:
        assert built.returncode == 0, built.stderr
    else:
        assert built.returncode != 0
        assert "frontend/dist/index.html is missing: run `make frontend` first" in (
            built.stdout + built.stderr
        )
