"""Finding 9 (issue 27): a cluster process never holds the control plane's secrets.

Deleting them from `os.environ` at start left them in /proc/PID/environ for the process's
life, readable by its user and by root: `nebula worker` and `nebula switch` now refuse to
start with either set, and name it. `nebula up` starts its cluster processes without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import Settings
from cli.up import cluster_environment

SECRETS = {
    "NEBULA_SECRET_KEY": "the-platform-secret-of-the-control-plane",
    "NEBULA_DATABASE_URL": "postgresql+psycopg://nebula:hunter2@db.internal/nebula",
}


def _start(command: list[str], tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")}
    env.update(NEBULA_VAR_DIR=str(tmp_path / "var"), **extra)
    return subprocess.run(
        [sys.executable, "-m", "cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


WORKER = ["worker", "--cluster", "cluster-a", "--control-plane", "http://127.0.0.1:9"]
SWITCH = ["switch", "--cluster", "cluster-a", "--control-plane", "http://127.0.0.1:9"]


@pytest.mark.parametrize("command", [WORKER, SWITCH], ids=["worker", "switch"])
@pytest.mark.parametrize("name", sorted(SECRETS))
def test_a_cluster_process_with_a_control_plane_secret_set_refuses_to_start(
    command: list[str], name: str, tmp_path: Path
) -> None:
    started = _start(command, tmp_path, **{name: SECRETS[name]})
    assert started.returncode == 2, started.stderr
    assert name in started.stderr
    assert "refuses to start" in started.stderr
    assert SECRETS[name] not in started.stderr + started.stdout  # named, never echoed
    assert not (tmp_path / "var").exists()  # it did nothing else first


def test_both_secrets_are_named(tmp_path: Path) -> None:
    started = _start(WORKER, tmp_path, **SECRETS)
    assert started.returncode == 2
    assert "NEBULA_DATABASE_URL and NEBULA_SECRET_KEY" in started.stderr


def test_without_them_the_worker_goes_on_to_its_own_checks(tmp_path: Path) -> None:
    # no secret: it gets past the refusal, to the next thing it needs (its switch's state)
    started = _start(WORKER, tmp_path)
    assert "refuses to start" not in started.stderr
    assert started.returncode != 0  # no switch has run for cluster-a here


def test_nebula_up_starts_cluster_processes_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    env = cluster_environment(Settings(var_dir=tmp_path), "http://127.0.0.1:8000")
    assert not set(SECRETS) & set(env)
    assert "NEBULA_DATA_DIR" not in env
