"""The OpenAPI document tells the truth: schemathesis, every check and phase on (stateful
included), against a live server as an admin and as a member, finds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.accounts.models import Role
from app.settings import Settings
from support.platforms import PASSWORD, make_user
from support.servers import LiveServer

HERE = Path(__file__).resolve().parent
# Bounded so that both roles together stay within a minute or two on two cores.
MAX_EXAMPLES = int(os.environ.get("NEBULA_FUZZ_EXAMPLES", "10"))
SEED = os.environ.get("NEBULA_FUZZ_SEED", "19")
# Logging out ends the very session the run authenticates with, after which every answer is a
# 401; tests/app/accounts/test_auth.py covers it.
EXCLUDED = ["/api/v1/auth/logout"]


def _worker_credential(server: LiveServer) -> str:
    """A registered cluster's worker credential, so that the cluster API is reached for real."""
    from app.audit.service import SYSTEM
    from app.clusters import service as clusters

    with server.app.state.sessionmaker() as db:
        cluster = clusters.create(
            db, actor=SYSTEM, name="fuzz-east", switch_host="127.0.0.1", switch_port=7101
        )
        _row, secret = clusters.create_worker_credential(db, actor=SYSTEM, cluster=cluster)
        db.commit()
    return secret


def _schemathesis(server: LiveServer, token: str, folder: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "run",
        f"{server.url}/api/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        SEED,
        "--workers",
        "1",
        "--no-color",
        "--header",
        f"Authorization: Bearer {token}",
        # the cluster API's roles also need a job token, which only a running job holds: they
        # answer 401 here, and their documented statuses are checked all the same
        "--header",
        f"X-Nebula-Worker: {_worker_credential(server)}",
        "--report",
        "junit",
        "--report-junit-path",
        str(folder / "junit.xml"),
        "--generation-database",
        "none",
    ]
    for path in EXCLUDED:
        command += ["--exclude-path", path]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), str(HERE)]),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, cwd=folder, check=False
    )


# Each role once and each database once: a run takes two minutes on two cores, and the
# document's truth depends on what a role may reach far more than on the database behind it.
# Without services (a laptop's `make test`) the PostgreSQL run skips and the member's runs alone.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("role", "database_url"),
    [(Role.admin, "postgresql"), (Role.member, "sqlite")],
    indirect=["database_url"],
)
def test_schemathesis_finds_nothing(
    settings: Settings, role: Role, tmp_path: Path, database_url: str
) -> None:
    # one client sending thousands of refusals on purpose would be throttled (429) past its
    # budget, on operations whose valid input must be accepted; the throttle has its own
    # tests (tests/security/test_audit_flood.py)
    settings = settings.model_copy(update={"audit_refusals_per_window": 1_000_000})
    with LiveServer(settings) as server:
        email = f"{role.value}@example.org"
        make_user(server.app.state.sessionmaker, settings, role=role, email=email)
        login = httpx.post(
            f"{server.url}/api/v1/auth/login", json={"email": email, "password": PASSWORD}
        )
        assert login.status_code == 200, login.text
        run = _schemathesis(server, login.json()["token"], tmp_path)
    summary = run.stdout[run.stdout.find("=== SUMMARY") :] or run.stdout[-3000:]
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
    assert "Stateful" in summary and "generated" in summary, summary
    print(summary)
