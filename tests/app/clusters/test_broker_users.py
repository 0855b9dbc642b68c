"""A cluster's broker user fails loudly, and a bundle written again breaks no running host.

Against the machine's RabbitMQ. "A user who cannot run rabbitmqctl" is the real
`rabbitmqctl` run as `nobody` (it refuses: only root or rabbitmq may run it), as the
control plane's service user without the Erlang cookie is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.accounts.models import Role
from app.audit.models import AuditEvent
from app.clusters import broker
from app.clusters.bundle import broker_password
from app.clusters.models import Cluster, ClusterPresence
from app.settings import Settings, get_settings
from cli.main import main as nebula_main
from support.platforms import Platform
from support.services import RABBITMQ_URL
from workers.bundle import load_bundle

pytestmark = [
    pytest.mark.services,
    # the broker is what is under test; one database kind keeps rabbitmqctl's seconds down
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]


@pytest.fixture
def settings(settings: Settings, vhost: str) -> Settings:
    """The test's platform with RabbitMQ as its broker, on a virtual host of its own."""
    return settings.model_copy(update={"broker_url": f"{RABBITMQ_URL}/{vhost}"})


@pytest.fixture
def cluster_name() -> Iterator[str]:
    name = f"east-{uuid.uuid4().hex[:6]}"
    yield name
    subprocess.run(
        ["rabbitmqctl", "--quiet", "delete_user", broker.user_for(name)],
        capture_output=True,
        timeout=60,
    )


@pytest.fixture
def no_rabbitmqctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rabbitmqctl` on PATH runs as a user the broker refuses (nobody)."""
    real, setpriv = shutil.which("rabbitmqctl"), shutil.which("setpriv")
    if os.geteuid() != 0 or real is None or setpriv is None:
        pytest.skip("needs root, setpriv and rabbitmqctl to run rabbitmqctl as another user")
    folder = tmp_path / "bin"
    folder.mkdir()
    wrapper = folder / "rabbitmqctl"
    wrapper.write_text(
        f'#!/bin/sh\nexec {setpriv} --reuid=nobody --regid=nogroup --clear-groups {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def nebula(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    settings: Settings,
    *argv: str,
) -> tuple[int, str, str]:
    """Run a `nebula` command in this process against the test's platform."""
    assert settings.secret_key is not None
    with monkeypatch.context() as env:
        env.setenv("NEBULA_DATABASE_URL", settings.resolved_database_url)
        env.setenv("NEBULA_VAR_DIR", str(settings.var_dir))
        env.setenv("NEBULA_SECRET_KEY", settings.secret_key.get_secret_value())
        env.setenv("NEBULA_BROKER_URL", settings.broker_url)
        get_settings.cache_clear()
        capsys.readouterr()
        try:
            code = nebula_main(list(argv))
        finally:
            get_settings.cache_clear()
    out, err = capsys.readouterr()
    return code, out, err


def _register(client: TestClient, platform: Platform, name: str, host: str = "127.0.0.1") -> dict:
    admin = platform.user(Role.admin)
    answer = client.post(
        "/api/v1/clusters",
        json={"name": name, "switch_host": host, "switch_port": 7101},
        headers=admin.headers,
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json(), headers=admin.headers)


def test_a_cluster_registered_without_its_broker_user_says_so_everywhere(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    cluster_name: str,
    no_rabbitmqctl: None,
) -> None:
    created = _register(client, platform, cluster_name)
    assert created["broker_user"] == "missing"
    problem = created["broker_problem"]
    assert "rabbitmqctl list_users failed" in problem  # the Erlang cookie, refused
    assert f"nebula clusters broker-user {cluster_name}" in problem
    listed = client.get("/api/v1/clusters", headers=created["headers"]).json()["items"]
    assert [(c["name"], c["broker_user"], c["broker_problem"]) for c in listed] == [
        (cluster_name, "missing", problem)
    ]
    with platform.factory() as db:
        cluster = db.scalars(select(Cluster).where(Cluster.name == cluster_name)).one()
        events = db.scalars(
            select(AuditEvent).where(AuditEvent.action == "cluster.broker_user")
        ).all()
        password = broker_password(settings, cluster)
    assert [(e.outcome, e.subject_id, e.details["problem"]) for e in events] == [
        ("failure", created["id"], problem)
    ]
    # the password the user would have is in neither the answer nor the audit log
    assert password not in problem


def test_bundle_as_a_user_who_cannot_run_rabbitmqctl_names_the_command_to_run(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    cluster_name: str,
    no_rabbitmqctl: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    created = _register(client, platform, cluster_name)
    out = tmp_path / "bundle"
    code, _out, err = nebula(
        monkeypatch, capsys, settings, "clusters", "bundle", cluster_name, "--out", str(out)
    )
    assert code == 1 and not out.exists()
    found = re.search(r"Run this as root on the broker host: (sh -c .*)$", err.strip())
    assert found, err
    # root runs that one command (this test runs as root)
    command = found.group(1)
    root_path = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(["sh", "-c", command], env=root_path, check=True, capture_output=True)
    # the same user writes the bundle now: the broker takes the cluster's password
    code, _out, err = nebula(
        monkeypatch, capsys, settings, "clusters", "bundle", cluster_name, "--out", str(out)
    )
    assert code == 0, err
    url = load_bundle(out).broker_url
    assert url.startswith(f"amqp://{broker.user_for(cluster_name)}:")
    assert broker.logs_in(url)
    listed = client.get(f"/api/v1/clusters/{created['id']}", headers=created["headers"]).json()
    assert (listed["broker_user"], listed["broker_problem"]) == ("ok", None)


def test_a_second_bundle_keeps_the_broker_password_until_it_is_rotated(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    cluster_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    created = _register(client, platform, cluster_name)
    assert (created["broker_user"], created["broker_problem"]) == ("ok", None)
    first, second, rotated = tmp_path / "first", tmp_path / "second", tmp_path / "rotated"
    ca = tmp_path / "broker-ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nbroker CA\n-----END CERTIFICATE-----\n")
    assert nebula(monkeypatch, capsys, settings, "clusters", "bundle", cluster_name, "--out",
                  str(first))[0] == 0  # fmt: skip
    # the second one for the same cluster, as its hosts reach the broker over TLS
    code, _out, err = nebula(
        monkeypatch, capsys, settings, "clusters", "bundle", cluster_name, "--out", str(second),
        "--broker-url", "amqps://127.0.0.1:5671/x", "--broker-ca", str(ca),
    )  # fmt: skip
    assert code == 0, err
    old, again = load_bundle(first).broker_url, load_bundle(second).broker_url
    assert again == old.replace("amqp://", "amqps://").rsplit(":", 1)[0] + ":5671/x"
    assert (second / "broker-ca.pem").read_bytes() == ca.read_bytes()
    assert broker.logs_in(old)  # the host running on the first bundle still logs in
    with platform.factory() as db:
        db.add(ClusterPresence(
            cluster_id=created["id"], kind="worker", instance=f"gpu-1.site:{cluster_name}:41",
            version="test",
        ))  # fmt: skip
        db.commit()
    code, out, err = nebula(
        monkeypatch, capsys, settings, "clusters", "bundle", cluster_name, "--out", str(rotated),
        "--rotate-broker-password",
    )  # fmt: skip
    assert code == 0, err
    assert "broker password of" in out and "gpu-1.site (worker)" in out
    new = load_bundle(rotated).broker_url
    assert new != old and broker.logs_in(new) and not broker.logs_in(old)
    with platform.factory() as db:
        actions = db.scalars(
            select(AuditEvent.action).where(AuditEvent.subject_id == created["id"])
        ).all()
    assert "cluster.broker_password_rotate" in actions


def test_a_remote_cluster_gets_no_shared_or_clear_text_broker_identity(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"far-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "bundle"
    # RabbitMQ reached in clear from another host: refused before the broker is touched
    embedded = settings.model_copy(update={"broker_url": ""})
    with platform.factory() as db:
        db.add(Cluster(name=name, switch_host="switch.far.example.org", switch_port=7101))
        db.commit()
    code, _out, err = nebula(
        monkeypatch, capsys, settings, "clusters", "bundle", name, "--out", str(out),
        "--broker-url", "amqp://10.0.0.5:5672/nebula",
    )  # fmt: skip
    assert code == 1 and "--insecure-plain-broker" in err and not out.exists()
    # a broker without users (the embedded one, Redis) would share the control plane's
    code, _out, err = nebula(
        monkeypatch, capsys, embedded, "clusters", "bundle", name, "--out", str(out)
    )
    assert code == 1 and "--insecure-shared-broker" in err and not out.exists()
    code, _out, err = nebula(
        monkeypatch, capsys, embedded, "clusters", "bundle", name, "--out", str(out),
        "--insecure-shared-broker",
    )  # fmt: skip
    assert code == 0, err
    assert load_bundle(out).cluster == name
