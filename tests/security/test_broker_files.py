"""The embedded broker's messages carry job tokens: nobody but the platform's account reads them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# in a process of its own: the broker makes its process's new files private (its umask)
PUBLISH = """
import sys
from pathlib import Path
from common.broker import make_celery
from contract.queues import RUN_ROLE_TASK
app = make_celery("", Path(sys.argv[1]))
app.send_task(RUN_ROLE_TASK, kwargs={"token": "a job token"}, queue="cluster.a")
"""


def test_broker_files_are_0600_in_0700_folders(tmp_path: Path) -> None:
    var = tmp_path / "var"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", PUBLISH, str(var)],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    folders = [var / "broker", *(var / "broker").iterdir()]
    assert {oct(stat.S_IMODE(f.stat().st_mode)) for f in folders} == {"0o700"}
    messages = list((var / "broker" / "queue").iterdir())
    assert messages, "the task was not published"
    assert all(b"a job token" in m.read_bytes() for m in messages)
    assert {oct(stat.S_IMODE(m.stat().st_mode)) for m in messages} == {"0o600"}
