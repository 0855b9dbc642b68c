"""`nebula doctor` green on a healthy platform, red with the named fix when something is not;
and a NEBULA_ variable no setting reads is named in a warning."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from sqlalchemy import update

from app.accounts.models import Role
from app.clusters.models import Certificate
from app.db import utcnow
from app.settings import Settings
from cli.doctor import report, run_checks
from cli.main import unknown_settings
from support.platforms import Platform, anchor_now
from workers.switch.tls import make_switch_key_and_csr

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _states(checks: list) -> dict[str, str]:
    return {c.name: c.state for c in checks}


@SQLITE
def test_doctor_is_green_then_red_with_the_fix(
    client: TestClient, platform: Platform, settings: Settings, tmp_path: Path
) -> None:
    admin = platform.user(Role.admin)
    cluster = client.post(
        "/api/v1/clusters",
        json={"name": "east", "switch_host": "127.0.0.1", "switch_port": 7101},
        headers=admin.headers,
    ).json()
    _key, csr = make_switch_key_and_csr("east")
    issued = client.post(
        f"/api/v1/clusters/{cluster['id']}/csr",
        json={"csr_pem": csr.decode()},
        headers=admin.headers,
    )
    assert issued.status_code == 201, issued.text
    anchor_now(platform)
    checks = run_checks(settings)
    assert set(_states(checks).values()) == {"ok"}, checks
    assert {"database", "broker", "secret", "CA", "anchors"} <= set(_states(checks))
    console = Console(file=(tmp_path / "green.txt").open("w"), width=200)
    assert report(checks, console) == 0

    # the switch's certificate ran out (its switch stopped renewing it)
    with platform.factory() as db:
        db.execute(
            update(Certificate)
            .where(Certificate.serial == issued.json()["serial"])
            .values(not_after=utcnow() - timedelta(days=1))
        )
        db.commit()
    # and the broker is down
    stopped = settings.model_copy(update={"broker_url": "amqp://guest:guest@127.0.0.1:1//"})
    checks = {c.name: c for c in run_checks(stopped)}
    expired = checks["cluster east switch certificate"]
    assert expired.state == "fail" and expired.detail.startswith("expired on ")
    assert "nebula clusters bundle east --out east-bundle" in expired.fix
    assert "with the options its first bundle had (--control-plane-ca, --broker-ca" in expired.fix
    assert "move switch.crt and switch.key out" in expired.fix
    assert checks["broker"].state == "fail"
    assert "systemctl start rabbitmq-server" in checks["broker"].fix
    assert checks["database"].state == "ok" and checks["anchors"].state == "ok"
    out = tmp_path / "red.txt"
    with out.open("w") as handle:
        assert report(list(checks.values()), Console(file=handle, width=400)) == 1
    text = out.read_text()
    assert "FAIL cluster east switch certificate: expired on" in text
    assert "fix: on the control plane: nebula clusters bundle east" in text


@SQLITE
def test_doctor_names_a_database_behind_its_migrations(
    client: TestClient, settings: Settings
) -> None:
    from app.migrate import downgrade

    client.app.state.engine.dispose()  # type: ignore[attr-defined]
    downgrade(settings.resolved_database_url, "0010")
    checks = {c.name: c for c in run_checks(settings)}
    assert checks["database"].state == "fail"
    assert "at migration 0010" in checks["database"].detail
    assert "nebula db upgrade" in checks["database"].fix


def test_an_unknown_nebula_variable_is_named_with_the_near_one() -> None:
    environ = {
        "NEBULA_DATABSE_URL": "postgresql://x",
        "NEBULA_VAR_DIR": "/var/lib/nebula",
        "NEBULA_TEST_REDIS_URL": "redis://",  # the tests' own
        "PATH": "/usr/bin",
    }
    assert unknown_settings(environ) == [
        "unknown setting NEBULA_DATABSE_URL is ignored (did you mean NEBULA_DATABASE_URL?)"
    ]
    assert unknown_settings({"NEBULA_CONTROL_PLANE_URL": "https://cp"}) == []  # cluster side
    assert unknown_settings({"NEBULA_PEERS": "--peer west=203.0.113.20:7101"}) == []  # units


def test_an_env_file_with_a_typo_warns_when_loaded(tmp_path: Path) -> None:
    env_file = tmp_path / "control-plane.env"
    env_file.write_text(f"NEBULA_VAR_DIR={tmp_path / 'var'}\nNEBULA_SECRT_KEY=abc\n")
    done = subprocess.run(
        [
            "sh",
            "-c",
            f'set -a; . "{env_file}"; exec "$0" -m cli db grants nebula_app',
            sys.executable,
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        env={"PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "unknown setting NEBULA_SECRT_KEY is ignored (did you mean NEBULA_SECRET_KEY?)" in (
        done.stderr
    )
