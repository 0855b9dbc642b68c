"""`nebula serve --tls-cert/--tls-key`: the control plane over HTTPS, as cluster hosts reach it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from support.certs import localhost_certificate
from support.processes import environment, serving
from workers.control_plane import ClusterClient, Refused, tls_verify
from workers.ports import free_port

pytestmark = pytest.mark.slow


def test_the_control_plane_serves_https_and_clusters_reach_it_there(tmp_path: Path) -> None:
    ca_path, cert, key = localhost_certificate(tmp_path, "server")
    port = free_port()
    env = environment(NEBULA_VAR_DIR=str(tmp_path / "var"), NEBULA_RUN_REAPER="false")
    nebula = [sys.executable, "-m", "cli"]
    subprocess.run([*nebula, "db", "upgrade"], env=env, check=True, capture_output=True)
    admin = {"email": "ops@tls.example.org", "password": "a long enough password 1"}
    subprocess.run(
        [*nebula, "users", "create-admin", admin["email"]],
        input=admin["password"] + "\n",
        text=True,
        env=env,
        check=True,
        capture_output=True,
    )
    login_file = tmp_path / "login.json"
    login_file.write_text(json.dumps(admin))
    url = f"https://localhost:{port}"

    def healthz() -> httpx.Response | None:
        try:
            return httpx.get(f"{url}/healthz", verify=tls_verify(ca_path), timeout=5)
        except httpx.TransportError:
            return None

    with serving(
        [*nebula, "serve", "--port", str(port), "--tls-cert", str(cert), "--tls-key", str(key)],
        tmp_path / "serve.log",
        env=env,
        ready=lambda _log: healthz() is not None,
        what="nebula serve over TLS",
        timeout=60,
        stop_signal=signal.SIGTERM,
        stop_timeout=20,
    ):
        answer = healthz()
        assert answer is not None
        assert answer.status_code == 200
        assert answer.http_version in ("HTTP/1.1", "HTTP/2")
        # plain http on the same port gets no API
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://localhost:{port}/healthz", timeout=5).raise_for_status()
        # a client that does not trust the certificate's CA refuses the connection
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", timeout=5)
        # a worker reaches the cluster API over it (and is refused: no such credential)
        client = ClusterClient(url, credential="nbw_unknown", ca_path=ca_path)
        with pytest.raises(Refused) as refused:
            client.whoami()
        client.close()
        assert refused.value.status == 401
        # `nebula demo` signs in over it with the CA and login it is given: it gets as far
        # as asking for two clusters, which this control plane has not
        demo = [*nebula, "demo", "--url", url, "--login-file", str(login_file)]
        trusted = subprocess.run(
            [*demo, "--ca", str(ca_path)], env=env, capture_output=True, text=True, timeout=120
        )
        assert trusted.returncode == 1
        assert "the demo needs two clusters" in trusted.stdout + trusted.stderr
        untrusted = subprocess.run(demo, env=env, capture_output=True, text=True, timeout=120)
        assert untrusted.returncode == 1
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stdout + untrusted.stderr


def test_serve_wants_the_certificate_and_its_key_together(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--tls-cert", str(tmp_path / "x.crt")],
        capture_output=True,
        text=True,
        env={**os.environ, "NEBULA_VAR_DIR": str(tmp_path / "var")},
        timeout=60,
    )
    assert done.returncode != 0 and "go together" in done.stderr
