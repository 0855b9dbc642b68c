"""A deployment across separate network hosts: the control plane and two clusters.

Four hosts, each a network namespace: the services host (the root namespace:
PostgreSQL and RabbitMQ, which it forwards to the control plane's link only), the
control plane (the API over HTTPS, and the broker over amqps: TLS ended there, the
bytes forwarded), and two clusters, each linked to the control plane and, by a WAN link,
to each other; nothing is routed between links. The clusters are registered, bundled and started from their bundles as
docs/deploy.md says; ELECTRA and then ABNet run end to end; and every TCP connection
of each cluster host, sampled from its own kernel table during the run, goes only to
the API, the broker, or the peer switch. The database answers nothing from a cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.platforms import PASSWORD
from support.processes import wait_until
from support.services import PostgresTemplates, service_unavailable
from workers.control_plane import tls_verify
from workers.ports import free_port
from workers.training.data import write_demo_corpus

from .hosts import (
    TCP_ESTABLISHED,
    TCP_SYN_SENT,
    Namespace,
    Network,
    Relay,
    namespaces_usable,
    run,
    write_server_certificate,
)

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# addresses of the test's own: services to control plane, control plane to cluster A and to
# cluster B, the WAN between the clusters
SERVICES_CP, CP_SERVICES = "10.231.0.1", "10.231.0.2"
CP_A, A_CP = "10.231.1.1", "10.231.1.2"
CP_B, B_CP = "10.231.2.1", "10.231.2.2"
A_WAN, B_WAN = "10.231.3.1", "10.231.3.2"
PEER_PORT, WORKER_PORT, AMQP_PORT, PG_PORT = 7101, 7201, 5672, 5432
AMQPS_PORT = 5671  # the clusters' door to the broker: TLS, ended on the control plane
WORKERS_PER_CLUSTER = 2


@dataclass
class Site:
    """One cluster host and the processes it runs."""

    name: str
    host: Namespace
    control_plane_ip: str  # the control plane's address on this cluster's link
    wan_ip: str
    peer_wan_ip: str
    bundle: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    seen: set[tuple[str, int, str, int]] = field(default_factory=set)


@dataclass
class Deployment:
    api: httpx.Client
    api_port: int
    control_plane: Namespace
    sites: dict[str, Site]
    logs: Path


def _nebula(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


@pytest.fixture(scope="module")
def deployment(
    pg_templates: PostgresTemplates | Exception, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    reason = namespaces_usable()
    if reason is not None:
        service_unavailable("network namespaces", RuntimeError(reason))
    if isinstance(pg_templates, Exception):
        service_unavailable("PostgreSQL", pg_templates)
        raise AssertionError("unreachable")
    vhost = f"nebula-deploy-{uuid.uuid4().hex[:8]}"
    try:
        run("rabbitmqctl", "--quiet", "add_vhost", vhost)
        run("rabbitmqctl", "--quiet", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    except (RuntimeError, OSError) as exc:
        service_unavailable("RabbitMQ (rabbitmqctl)", exc)
    root = tmp_path_factory.mktemp("deploy")
    database = pg_templates.fresh()
    network = Network(f"nb{os.getpid() % 10000}")
    relays: list[Relay] = []
    processes: list[subprocess.Popen[bytes]] = []
    logs = root / "logs"
    logs.mkdir()

    def start(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = (logs / f"{name}.log").open("ab")
        process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    try:
        cp, host_a, host_b = network.host("cp"), network.host("a"), network.host("b")
        network.link_to_root(cp, SERVICES_CP, CP_SERVICES, "sv")
        network.link_hosts(cp, CP_A, host_a, A_CP, "ca")
        network.link_hosts(cp, CP_B, host_b, B_CP, "cb")
        network.link_hosts(host_a, A_WAN, host_b, B_WAN, "wan")
        # the services host forwards PostgreSQL and RabbitMQ to the control plane's link alone
        relays = [Relay((SERVICES_CP, port), ("127.0.0.1", port)) for port in (PG_PORT, AMQP_PORT)]
        ca_path, cert, key = write_server_certificate(root, [CP_A, CP_B, CP_SERVICES])

        base_env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")}
        base_env["OMP_NUM_THREADS"] = "1"
        services_db = database.replace("127.0.0.1:5432", f"{SERVICES_CP}:{PG_PORT}")
        cp_env = {
            **base_env,
            "NEBULA_VAR_DIR": str(root / "control-plane"),
            "NEBULA_DATABASE_URL": services_db,
            "NEBULA_BROKER_URL": f"amqp://guest:guest@{SERVICES_CP}:{AMQP_PORT}/{vhost}",
            "NEBULA_SECRET_KEY": "deploy-test-secret",
            "NEBULA_ARGON2_TIME_COST": "1",
            "NEBULA_ARGON2_MEMORY_KIB": "1024",
            "NEBULA_ARGON2_PARALLELISM": "1",
            "NEBULA_REAPER_INTERVAL_S": "0.5",
            "NEBULA_HEARTBEAT_TIMEOUT_S": "10",
        }
        # the control plane offers the broker to its cluster links over TLS only (amqps,
        # its certificate from the same CA as the API's): a TLS listener in front of the
        # broker, as a TLS-terminating balancer would be, since the machine's shared
        # RabbitMQ has no TLS listener of its own and cannot be restarted to add one
        start(
            "broker-tls",
            cp.exec_argv(
                sys.executable,
                str(Path(__file__).with_name("hosts.py")),
                "relay",
                f"0.0.0.0:{AMQPS_PORT}",
                f"{SERVICES_CP}:{AMQP_PORT}",
                str(cert),
                str(key),
            ),
            base_env,
        )
        api_port = free_port()
        start(
            "api",
            cp.exec_argv(
                *_nebula(
                    "serve",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    str(api_port),
                    "--tls-cert",
                    str(cert),
                    "--tls-key",
                    str(key),
                )
            ),
            cp_env,
        )
        url = f"https://{CP_SERVICES}:{api_port}"
        api = httpx.Client(base_url=f"{url}/api/v1", verify=tls_verify(ca_path), timeout=60)

        def healthy() -> bool:
            try:
                answer = httpx.get(f"{url}/healthz", verify=tls_verify(ca_path), timeout=5)
                return answer.status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, "the control plane", 120)
        subprocess.run(
            cp.exec_argv(*_nebula("users", "create-admin", "admin@deploy.example.org")),
            input=PASSWORD + "\n",
            text=True,
            env=cp_env,
            check=True,
            capture_output=True,
        )
        login = api.post(
            "/auth/login", json={"email": "admin@deploy.example.org", "password": PASSWORD}
        )
        assert login.status_code == 200, login.text
        api.headers["Authorization"] = f"Bearer {login.json()['token']}"
        api.cookies.clear()

        sites = {
            "cluster-a": Site("cluster-a", host_a, CP_A, A_WAN, B_WAN, root / "bundle-a"),
            "cluster-b": Site("cluster-b", host_b, CP_B, B_WAN, A_WAN, root / "bundle-b"),
        }
        for site in sites.values():
            created = api.post(
                "/clusters",
                json={"name": site.name, "switch_host": site.wan_ip, "switch_port": PEER_PORT},
            )
            assert created.status_code == 201, created.text
            # on the broker's host (rabbitmqctl runs there): one command writes what the
            # cluster host needs
            subprocess.run(
                _nebula(
                    "clusters",
                    "bundle",
                    site.name,
                    "--out",
                    str(site.bundle),
                    "--control-plane",
                    f"https://{site.control_plane_ip}:{api_port}",
                    "--control-plane-ca",
                    str(ca_path),
                    "--broker-url",
                    f"amqps://{site.control_plane_ip}:{AMQPS_PORT}/{vhost}",
                    "--broker-ca",
                    str(ca_path),
                ),
                env=cp_env,
                check=True,
                capture_output=True,
            )
        for site in sites.values():
            cluster_env = {**base_env, "NEBULA_VAR_DIR": str(root / site.name)}
            other = next(s for s in sites.values() if s is not site)
            site.processes.append(
                start(
                    f"switch-{site.name}",
                    site.host.exec_argv(
                        *_nebula(
                            "switch",
                            "--bundle",
                            str(site.bundle),
                            "--peer",
                            f"{other.name}={site.peer_wan_ip}:{PEER_PORT}",
                            "--peer-host",
                            site.wan_ip,
                            "--peer-port",
                            str(PEER_PORT),
                            "--worker-host",
                            "127.0.0.1",
                            "--worker-port",
                            str(WORKER_PORT),
                        )
                    ),
                    cluster_env,
                )
            )
        for site in sites.values():
            wait_until((site.bundle / "switch.json").exists, f"the switch of {site.name}", 60)
            for number in range(WORKERS_PER_CLUSTER):  # a pool of worker processes
                site.processes.append(
                    start(
                        f"worker-{site.name}-{number}",
                        site.host.exec_argv(
                            *_nebula("worker", "--bundle", str(site.bundle), "--concurrency", "1")
                        ),
                        {**base_env, "NEBULA_VAR_DIR": str(root / site.name)},
                    )
                )
        yield Deployment(api=api, api_port=api_port, control_plane=cp, sites=sites, logs=logs)
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        for relay in relays:
            relay.close()
        network.close()
        pg_templates.drop(database)
        for name in ("cluster-a", "cluster-b"):
            subprocess.run(
                ["rabbitmqctl", "--quiet", "delete_user", f"nebula-cluster-{name}"],
                capture_output=True,
                check=False,
            )
        subprocess.run(["rabbitmqctl", "--quiet", "delete_vhost", vhost], capture_output=True)


class Sampler:
    """Reads each cluster host's and the control plane's TCP tables while the jobs run."""

    def __init__(self, sites: dict[str, Site], control_plane: Namespace) -> None:
        self.sites, self.control_plane = sites, control_plane
        self.control_plane_seen: set[tuple[str, int, str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for site in self.sites.values():
                for lip, lport, rip, rport, state in site.host.tcp_table():
                    if state in (TCP_ESTABLISHED, TCP_SYN_SENT):
                        site.seen.add((lip, lport, rip, rport))
            for lip, lport, rip, rport, state in self.control_plane.tcp_table():
                if state in (TCP_ESTABLISHED, TCP_SYN_SENT):
                    self.control_plane_seen.add((lip, lport, rip, rport))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _connects(host: Namespace, ip: str, port: int) -> bool:
    probe = "import socket,sys; s=socket.socket(); s.settimeout(3); sys.exit(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"
    done = subprocess.run(
        host.exec_argv(sys.executable, "-c", probe, ip, str(port)), capture_output=True, timeout=30
    )
    return done.returncode == 0


def _upload(api: httpx.Client, workspace: str, path: Path, kind: str, lines: int) -> str:
    data = b"".join(path.read_bytes().splitlines(keepends=True)[:lines])
    answer = api.post(
        f"/workspaces/{workspace}/datasets",
        data={"name": path.name, "kind": kind, "discoverable": "false"},
        files={"file": (path.name, data)},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _run_job(api: httpx.Client, workspace: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = api.post(f"/workspaces/{workspace}/jobs", json=body)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]

    def finished() -> dict[str, Any] | None:
        job = api.get(f"/jobs/{job_id}").json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    done: dict[str, Any] = wait_until(finished, f"job {job_id}", timeout=300)
    assert done["status"] == "succeeded", done["error"]
    return done


def test_electra_then_abnet_across_three_hosts_touch_only_the_api_broker_and_peer(
    deployment: Deployment, tmp_path: Path
) -> None:
    api, sites = deployment.api, deployment.sites
    # what a cluster host cannot reach: the database, or the control plane's loopback services
    for site in sites.values():
        assert not _connects(site.host, site.control_plane_ip, PG_PORT)
        assert not _connects(site.host, SERVICES_CP, PG_PORT)  # no route to the services host
        assert not _connects(site.host, site.control_plane_ip, 6379)
        assert _connects(site.host, site.control_plane_ip, deployment.api_port)

    # both clusters report in: their switch and their pool of workers
    def healthy() -> bool:
        clusters = api.get("/clusters").json()["items"]
        return all(
            c["switch_online"] and c["workers_online"] == WORKERS_PER_CLUSTER for c in clusters
        )

    wait_until(healthy, "both clusters' switches and workers online", timeout=90)

    corpus = write_demo_corpus(tmp_path / "corpus")
    workspace = api.get("/workspaces").json()["items"][0]["id"]
    text = _upload(api, workspace, corpus["text"], "text", lines=600)
    pairs = _upload(api, workspace, corpus["parallel.train"], "parallel", lines=300)
    with Sampler(sites, deployment.control_plane) as sampler:
        electra = _run_job(
            api,
            workspace,
            {
                "kind": "electra_pretrain",
                "config": {"preset": "tiny", "steps": 6, "batch_size": 8, "ckpt_every": 2},
                "inputs": {"text": text},
                "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
            },
        )
        model = next(
            a
            for a in api.get(f"/jobs/{electra['id']}/artifacts").json()["items"]
            if a["kind"] == "model"
        )
        abnet = _run_job(
            api,
            workspace,
            {
                "kind": "abnet_finetune",
                "config": {"preset": "tiny", "steps": 3, "batch_size": 8},
                "inputs": {
                    "parallel": pairs,
                    "source_model": model["dataset_id"],
                    "target_model": model["dataset_id"],
                },
                "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
            },
        )
    assert "decoder.loss" in abnet["metrics"]
    # every worker reached the broker over TLS, through the CA its bundle carries
    for site in sites.values():
        for number in range(WORKERS_PER_CLUSTER):
            log = (deployment.logs / f"worker-{site.name}-{number}.log").read_text()
            assert f"Connected to amqps://nebula-cluster-{site.name}" in log, log[-2000:]

    for site in sites.values():
        allowed_out = {
            (site.control_plane_ip, deployment.api_port),
            (site.control_plane_ip, AMQPS_PORT),
            (site.peer_wan_ip, PEER_PORT),
        }
        outbound, inbound, strays = set(), set(), []
        for lip, lport, rip, rport in site.seen:
            if lip == rip == "127.0.0.1":
                continue  # a worker and its own switch, on the host's loopback
            if (lip, lport) == (site.wan_ip, PEER_PORT) and rip == site.peer_wan_ip:
                inbound.add(rip)  # the peer switch dialling this one
            elif (rip, rport) in allowed_out:
                outbound.add((rip, rport))
            else:
                strays.append((lip, lport, rip, rport))
        assert not strays, f"{site.name} connected elsewhere: {strays}"
        # and it did use each of the three doors
        assert outbound >= {
            (site.control_plane_ip, deployment.api_port),
            (site.control_plane_ip, AMQPS_PORT),
        }, outbound
        assert (site.peer_wan_ip, PEER_PORT) in outbound or inbound, (outbound, inbound)

    # the control plane reaches out only to the database and the broker on the services
    # host; everything else is someone connecting to its API or broker port
    served = {deployment.api_port, AMQPS_PORT}
    strays = [
        c
        for c in sampler.control_plane_seen
        if not (c[0] == c[2] == "127.0.0.1")
        and c[1] not in served
        and (c[2], c[3]) not in {(SERVICES_CP, PG_PORT), (SERVICES_CP, AMQP_PORT)}
    ]
    assert not strays, f"the control plane connected elsewhere: {strays}"
    assert any((c[2], c[3]) == (SERVICES_CP, PG_PORT) for c in sampler.control_plane_seen)
