"""What docs/deploy.md tells an operator to copy works as written: the env examples source
in a shell and set no unknown variable, the units use the two database roles and the venv
the docs build, and the docs name only files that exist."""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

import pytest

from cli.main import unknown_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EXAMPLES = sorted(DEPLOY.glob("*.env.example"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_env_example_sources_in_a_shell_and_names_only_known_settings(example: Path) -> None:
    done = subprocess.run(
        ["sh", "-c", 'set -a && . "$0" && env -0', str(example)],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    environ = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    assert any(name.startswith("NEBULA_") for name in environ)
    assert unknown_settings(environ) == []


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    # systemd allows a key more than once (ExecStart=, EnvironmentFile=): keep the last
    # one per key here, and read repeated keys from the text
    parser.read_string((DEPLOY / name).read_text().replace("\\\n", " "))
    return parser


def test_the_api_serves_as_the_app_role_and_migrations_run_as_the_owner() -> None:
    api = (DEPLOY / "nebula-api.service").read_text()
    migrate = (DEPLOY / "nebula-migrate.service").read_text()
    assert "owner.env" not in api and "db upgrade" not in api
    assert "Requires=nebula-migrate.service" in api
    files = re.findall(r"^EnvironmentFile=(\S+)", migrate, re.M)
    # the owner's URL is read last, so it wins over the app role's
    assert files == ["/etc/nebula/control-plane.env", "/etc/nebula/owner.env"]
    assert "nebula db upgrade" in migrate and "nebula db grants nebula_app | psql" in migrate
    assert "nebula_app:" in (DEPLOY / "control-plane.env.example").read_text()
    assert "nebula_owner:" in (DEPLOY / "owner.env.example").read_text()
    for name in ("nebula-api.service", "nebula-switch.service", "nebula-worker@.service"):
        unit = _unit(name)
        assert unit["Service"]["User"] == "nebula", name
        assert unit["Service"]["ExecStart"].startswith("/opt/nebula/venv/bin/nebula "), name


def test_the_deploy_guide_names_files_that_exist_and_never_trust() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text()
    for path in set(re.findall(r"\bdeploy/[\w.@-]+", guide)):
        assert (ROOT / path).is_file(), path
    commands = "\n".join(re.findall(r"```sh\n(.*?)```", guide, re.S))
    assert "trust" not in commands and "scram-sha-256" in commands
    assert ".venv" not in guide
    # $TOKEN is obtained before it is used, and the service user is made before its folders
    assert commands.index("TOKEN=$(") < commands.index("Bearer $TOKEN")
    assert guide.index("adduser --system") < guide.index("install -d -o nebula")
    operations = (ROOT / "docs" / "operations.md").read_text()
    for section in ("## Health", "## Logs", "## Upgrade", "## Backup and restore",
                    "## Certificates", "## Adding and retiring hosts and clusters"):  # fmt: skip
        assert section in operations
