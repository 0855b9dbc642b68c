"""The embedded default: from a clean folder, `nebula up` and `nebula demo` succeed with no server.

While the demo's jobs run, the cluster processes (switches, workers and their pool
children) are watched: none holds the control plane's database or dataset store open,
and none has the database URL or the platform secret in its environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from support.servers import NebulaUp

pytestmark = pytest.mark.slow

SECRETS = (b"NEBULA_DATABASE_URL=", b"NEBULA_SECRET_KEY=")


def _cluster_processes(session: int) -> list[int]:
    """Switch and worker processes of one `nebula up` (its session), pool children included."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # field 6 of stat is the session id; the command name may hold spaces, so split after it
        if int(stat.rsplit(")", 1)[1].split()[3]) != session:
            continue
        if b"cli" in argv and (b"worker" in argv or b"switch" in argv):
            pids.append(int(entry.name))
    return pids


def _open_files(pid: int) -> set[str]:
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return set()
    targets = set()
    for fd in fds:
        try:
            targets.add(os.readlink(fd))
        except OSError:
            continue
    return targets


def test_nebula_up_then_demo_in_an_empty_folder(tmp_path: Path) -> None:
    with NebulaUp(tmp_path / "site") as up:
        var = (tmp_path / "site" / "var").resolve()
        assert httpx.get(f"{up.url}/readyz").json()["ready"] is True
        assert (var / "nebula.db").exists()  # SQLite, no database server
        assert (var / "broker").is_dir()  # the embedded broker
        demo = subprocess.Popen(
            up.command(
                "demo",
                "--url",
                up.url,
                "--electra-steps",
                "4",
                "--abnet-steps",
                "2",
                "--login-file",
                str(var / "demo-admin.json"),
                "--cleanup",
                "--json",
            ),
            cwd=up.folder,
            env=up.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seen: set[int] = set()
        opened: dict[int, set[str]] = {}
        environments: dict[int, bytes] = {}
        tick = threading.Event()
        while demo.poll() is None:
            for pid in _cluster_processes(up.process.pid):
                seen.add(pid)
                opened.setdefault(pid, set()).update(_open_files(pid))
                if pid not in environments:
                    with contextlib.suppress(OSError):
                        environments[pid] = Path(f"/proc/{pid}/environ").read_bytes()
            tick.wait(0.3)
        output = demo.stdout.read() if demo.stdout else ""
        assert demo.returncode == 0, output[-4000:]
        assert "BLEU on the test split" in output
        assert "chain verified: True" in output
        assert "bob downloading alice's raw text: 403" in output
        assert "bob downloading his model trained on alice's text: 403 (use-only)" in output
        assert "after alice released it: 200" in output
        # a summary a person reads, then (--json) the figures
        summary = output[output.index("Summary") :]
        assert "ABNet fine-tuning, encoder on" in summary
        assert "The demo's users and their data were removed (--cleanup)." in summary
        assert '"cleanup_left": []' in summary
        # each ABNet metric once in the table, not once per role
        abnet_rows = [
            line.split("│")[2].strip()
            for line in output[: output.index("Summary")].splitlines()
            if line.count("│") >= 3 and line.split("│")[1].strip() == "abnet_finetune"
        ]
        assert abnet_rows and len(abnet_rows) == len(set(abnet_rows)), abnet_rows
        assert not any(row.startswith(("encoder.", "decoder.")) for row in abnet_rows), abnet_rows
        # --cleanup: the demo's users are gone (their login refused)
        # (the console wraps lines at its width)
        users = re.search(
            r"users:\s+(\S+)\s+\(data\s+owner\),\s+(\S+)\s+\(data\s+scientist\)", output
        )
        assert users, output[-4000:]
        for email in users.groups():
            login = httpx.post(
                f"{up.url}/api/v1/auth/login", json={"email": email, "password": "x" * 16}
            )
            assert login.status_code in (401, 403), login.text

    # two switches, two workers and their pool children ran the jobs
    assert len(seen) >= 4, seen
    control_plane_files = [str(var / "nebula.db"), str(var / "data"), str(var / "secret_key")]
    for pid, files in opened.items():
        leaked = [f for f in files if any(f.startswith(p) for p in control_plane_files)]
        assert not leaked, f"cluster process {pid} had {leaked} open"
    for pid, environment in environments.items():
        for secret in SECRETS:
            assert secret not in environment, f"cluster process {pid} was given {secret!r}"
