"""Cluster-side code loads nothing of the control plane's database or storage."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import workers.runner, workers.tasks, workers.control_plane, workers.switch_agent
bad = sorted(m for m in sys.modules if m == "sqlalchemy" or m.startswith(("sqlalchemy.",
      "app.db", "app.workspaces", "app.grants", "app.pki", "app.audit", "psycopg")))
print(",".join(bad))
"""


def test_worker_and_switch_modules_import_no_database_or_storage() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "", done.stdout
