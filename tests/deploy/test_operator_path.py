"""docs/deploy.md and docs/operations.md, done as an operator does them.

Hosts are network namespaces sharing this machine's files: the control plane (its own
PostgreSQL cluster, made by initdb as the postgres user, with scram-sha-256 in pg_hba and
the two roles; RabbitMQ reached on its loopback, as if local), and two clusters, east and
west, each with a gateway host (the switch) and a compute host (a worker) on one site
network. Each host has a service user of its own, made as step 1 says; every file lives
under a folder per host (`/etc/nebula` is `<host>/etc/nebula`, and so on). The commands
are the documents' own, with those paths and names, `ip netns exec` where the documents
say `ssh`, and a process started as its systemd unit would (its user, its env file, no
other environment) where they say `systemctl`. The venv takes the wheel built from this
checkout (with its web UI) and, in place of the package index, the test environment's
packages; Node is on no path of a service.

One module fixture builds the deployment (deploy.md, steps 0 to 6); the tests, in order,
then follow deploy.md step 7 (the demo, with `--url --ca --login-file --cleanup`), write
a second bundle for a cluster whose worker then restarts on its old one (step 4),
operations.md's Health (`nebula doctor` green, a typo in the env file named, then red
with its fix while the broker is stopped), its Certificates (an expired switch
certificate red in `nebula doctor`, renewed as it says), a bundle folder of the wrong
owner or mode refused by the switch with the fix, its Backup and restore into a fresh
control-plane host, and its Upgrade of a control plane whose database the first migration
made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from support.processes import wait_until
from support.services import service_unavailable
from workers.control_plane import tls_verify

from .hosts import Namespace, Network, Relay, namespaces_usable, run, write_server_certificate

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HOSTS_PY = Path(__file__).with_name("hosts.py")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SYSTEM_PYTHON = Path("/usr/bin/python3")  # deploy.md, step 1: Debian's own Python
# root <-> control plane (what the control plane reaches this machine's RabbitMQ by), the
# site network the clusters reach the control plane on, root <-> the restored control plane
ROOT_CP, CP_ROOT = "10.233.0.1", "10.233.0.2"
CP_SITE = "10.233.1.1"
SITE_IPS = {"east-gw": "10.233.1.11", "east-c1": "10.233.1.12"}
SITE_IPS |= {"west-gw": "10.233.1.21", "west-c1": "10.233.1.22"}
ROOT_CP2, CP2_ROOT = "10.233.3.1", "10.233.3.2"
ROOT_OLD, OLD_ROOT = "10.233.4.1", "10.233.4.2"  # root <-> the control plane to upgrade
RABBIT_PORTS = (4369, 25672, 5672)  # epmd and the node's distribution (rabbitmqctl), AMQP
API_PORT = 8443
PASSWORD = "CHANGE-ME-a-long-passphrase"
ADMIN = "you@example.org"


@dataclass
class Host:
    """One host: its namespace, the folder that stands for its `/`, its service user."""

    name: str
    ns: Namespace
    root: Path
    user: str
    deployment: Deployment

    def path(self, absolute: str) -> Path:
        """Where the documents' `absolute` path of this host is."""
        return self.root / absolute.lstrip("/")

    def shell_env(self) -> dict[str, str]:
        """The variables a host's commands use for the documents' paths and names."""
        return {
            "PATH": f"{self.path('/usr/local/bin')}:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(self.path("/root")),
            "U": self.user,  # the service user, `nebula` in the documents
            "ETC": str(self.path("/etc/nebula")),
            "VAR": str(self.path("/var/lib/nebula")),
            "OPT": str(self.path("/opt/nebula")),
            "BIN": str(self.path("/usr/local/bin")),
            "BACKUPS": str(self.path("/var/backups/nebula")),
            "PG_HBA": str(self.path("/etc/postgresql/15/main/pg_hba.conf")),
            "ROOTHOME": str(self.path("/root")),
            "REPO": str(REPO),
            "PGHOST": str(self.path("/run/postgresql")),  # the host's own PostgreSQL socket
            "PGPORT": "5432",
            **self.deployment.names,
        }

    def sh(self, script: str, *, stdin: str | None = None, check: bool = True) -> str:
        """Run a root shell script on this host (`bash -eu -o pipefail`); its stdout."""
        done = subprocess.run(
            self.ns.exec_argv("bash", "-eu", "-o", "pipefail", "-c", script),
            input=stdin,
            env=self.shell_env(),
            cwd="/",
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"on {self.name}, exit {done.returncode}:\n{script}\n"
                f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
            )
        return done.stdout + (done.stderr if not check else "")

    def cp_nebula(self) -> str:
        """deploy.md, step 2: the `cp_nebula` function, with this host's paths."""
        return (
            'cp_nebula() { runuser -u "$U" -- sh -c \'cd "$0" && set -a && . "$1" && '
            'shift && exec nebula "$@"\' "$VAR" "$ETC/control-plane.env" "$@"; }\n'
        )

    def unit_argv(self, env_files: list[str], command: str) -> list[str]:
        """argv of a process started as its systemd unit would: User=, EnvironmentFile=,
        ExecStart=, an environment of nothing else (PATH without Node)."""
        path = f"{self.path('/opt/nebula/venv/bin')}:/usr/sbin:/sbin"
        assert shutil.which("node", path=path) is None
        sources = " && ".join(f". {self.path(f)}" for f in env_files)
        return self.ns.exec_argv(
            "runuser", "-u", self.user, "--", "env", "-i", f"PATH={path}",
            f"HOME={self.path('/var/lib/nebula')}", "OMP_NUM_THREADS=1", "/bin/sh", "-c",
            f"set -a && {sources} && set +a && exec {command}",
        )  # fmt: skip

    def unit(self, name: str, env_files: list[str], command: str) -> subprocess.Popen[bytes]:
        """Start a process as its systemd unit would (`unit_argv`)."""
        return self.deployment.start(f"{self.name}-{name}", self.unit_argv(env_files, command))


@dataclass
class Deployment:
    """Everything the test made, and how to take it down."""

    root: Path
    tag: str
    network: Network
    names: dict[str, str]
    namespaces: dict[str, Namespace] = field(default_factory=dict)
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    relays: list[Relay] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    postgres: list[Path] = field(default_factory=list)
    rabbit: list[list[str]] = field(default_factory=list)  # rabbitmqctl undo commands
    api: httpx.Client | None = None
    ca: Path | None = None

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        out = (logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd="/", start_new_session=True
        )
        self.processes[name] = process
        return process

    def stop(self, name: str) -> None:
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def log_text(self, name: str) -> str:
        path = self.root / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log(self, name: str) -> str:
        return self.log_text(name)[-4000:]

    def host(self, name: str, ns: Namespace) -> Host:
        """A new host: its folders as Debian has them (deploy.md starts from there)."""
        host = Host(name, ns, self.root / name, f"nb{self.tag}{name.replace('-', '')}", self)
        for folder in ("/etc", "/var/lib", "/var/backups", "/opt", "/usr/local/bin", "/run"):
            host.path(folder).mkdir(parents=True, exist_ok=True)
        host.path("/root").mkdir(mode=0o700, exist_ok=True)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        for name in list(self.processes):
            self.stop(name)
        for relay in self.relays:
            relay.close()
        for data in self.postgres:
            subprocess.run(
                ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(data),
                 "-m", "immediate", "stop"],
                capture_output=True, cwd="/", check=False, timeout=60,
            )  # fmt: skip
        for undo in self.rabbit:
            subprocess.run(["rabbitmqctl", "--quiet", *undo], capture_output=True, check=False)
        self.network.close()
        for user in self.users:
            subprocess.run(["deluser", "--system", user], capture_output=True, check=False)
            subprocess.run(["delgroup", "--system", user], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _build_wheel(out: Path) -> Path:
    """deploy.md, step 0: the wheel, with the web UI (built once where Node is)."""
    if not (REPO / "frontend" / "dist" / "index.html").is_file():
        if shutil.which("npm") is None or not (REPO / "frontend" / "node_modules").exists():
            service_unavailable(
                "the web UI build (frontend/dist)",
                RuntimeError("run `make frontend` once: the wheel carries the web UI"),
            )
        subprocess.run(
            ["npm", "run", "build", "--silent"], cwd=REPO / "frontend", check=True, timeout=300
        )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("nebula-*.whl")
    return wheel


def _step1(host: Host, wheel: Path) -> None:
    """deploy.md, step 1 on one host: the service user, its folders, the venv.

    The venv takes its dependencies from the test environment (no package index here): a
    .pth naming that environment's packages stands for `pip install torch` and the wheel's
    requirements; the wheel itself is installed as the documents say."""
    host.deployment.users.append(host.user)
    venv = host.path("/opt/nebula/venv")
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    host.sh(
        """
        adduser --system --group --home "$VAR" --shell /usr/sbin/nologin "$U" >/dev/null
        install -d -o "$U" -g "$U" -m 0700 "$VAR"
        install -d -o root -g "$U" -m 0750 "$ETC"
        """
    )
    if not venv.exists():
        host.sh(f'{SYSTEM_PYTHON} -m venv --without-pip "$OPT/venv"')
        (venv / "lib/python3.11/site-packages/test-environment.pth").write_text(f"{site}\n")
        # --ignore-installed: never touch the test environment's own (editable) nebula
        host.sh(
            f'"$OPT/venv/bin/python" -m pip install -q --no-deps --no-index --ignore-installed '
            f"{wheel}"
        )
    host.sh('ln -sf "$OPT/venv/bin/nebula" "$BIN/nebula"')


def _postgres(deployment: Deployment, host: Host) -> None:
    """`apt-get install postgresql` on the host: a cluster of its own, made by initdb as
    the postgres user, scram-sha-256 for TCP as Debian sets it, on the host's loopback."""
    data, socket_dir = host.path("/var/lib/postgresql/15/main"), host.path("/run/postgresql")
    for folder, mode in ((data, 0o700), (socket_dir, 0o2775)):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(mode)
        shutil.chown(folder, "postgres", "postgres")
    shutil.chown(data.parent, "postgres", "postgres")
    host.sh(
        f"""
        runuser -u postgres -- {PG_BIN}/initdb -D {data} -U postgres --no-sync \
            --auth-local=peer --auth-host=scram-sha-256 >/dev/null
        printf "%s\\n" "listen_addresses = 'localhost'" "port = 5432" \
            "unix_socket_directories = '{socket_dir}'" >> {data}/postgresql.conf
        install -d "$(dirname "$PG_HBA")" && ln -s {data}/pg_hba.conf "$PG_HBA"
        """
    )
    deployment.postgres.append(data)
    host.sh(f"runuser -u postgres -- {PG_BIN}/pg_ctl -D {data} -l {data}/log -w start >/dev/null")


def _rabbit_on_loopback(deployment: Deployment, host: Host, root_ip: str) -> None:
    """The machine's RabbitMQ on the host's loopback (AMQP, and epmd and the node's port
    for `rabbitmqctl`): a relay here, one on this machine's side of the link."""
    for port in RABBIT_PORTS:
        deployment.relays.append(Relay((root_ip, port), ("127.0.0.1", port)))
        deployment.start(
            f"{host.name}-relay-{port}",
            host.ns.exec_argv(
                sys.executable, str(HOSTS_PY), "relay", f"127.0.0.1:{port}", f"{root_ip}:{port}"
            ),
        )


def _step2_database(host: Host) -> None:
    """deploy.md, step 2: the two roles with passwords, and pg_hba's check."""
    host.sh(
        """
        OWNER_PASSWORD=$(openssl rand -hex 24); APP_PASSWORD=$(openssl rand -hex 24)
        runuser -u postgres -- psql -q -v ON_ERROR_STOP=1 \
          -c "SET password_encryption = 'scram-sha-256'" \
          -c "CREATE ROLE nebula_owner LOGIN PASSWORD '$OWNER_PASSWORD'" \
          -c "CREATE ROLE nebula_app LOGIN PASSWORD '$APP_PASSWORD'" \
          -c "CREATE DATABASE nebula OWNER nebula_owner"
        grep -E '^host +all +all +127.0.0.1/32 +scram-sha-256' "$PG_HBA" >/dev/null
        printf '%s\\n' "$OWNER_PASSWORD" > "$ROOTHOME/owner-password"
        printf '%s\\n' "$APP_PASSWORD" > "$ROOTHOME/app-password"
        """
    )


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    reason = namespaces_usable()
    if reason is not None:
        service_unavailable("network namespaces", RuntimeError(reason))
    for tool in ("adduser", "runuser", "rabbitmqctl", "openssl", "curl", "psql"):
        if shutil.which(tool) is None:
            service_unavailable(tool, RuntimeError("not installed"))
    if not (PG_BIN / "initdb").exists() or not SYSTEM_PYTHON.exists():
        service_unavailable("PostgreSQL 15's initdb or /usr/bin/python3", RuntimeError("missing"))
    try:
        run("rabbitmqctl", "--quiet", "list_vhosts")
    except (RuntimeError, OSError) as exc:
        service_unavailable("RabbitMQ (rabbitmqctl)", exc)

    # an operator's shell has Debian's umask; a test before this one in the same process
    # may have tightened it (an embedded broker makes every later file private)
    umask = os.umask(0o022)
    tag = uuid.uuid4().hex[:4]
    root = Path(tempfile.mkdtemp(prefix="nebula-operator-"))
    root.chmod(0o755)  # every host's service user walks through it
    names = {
        "VHOST": f"nebula-op-{tag}",
        "CP_BROKER_USER": f"nebula-cp-{tag}",
        "EAST": f"east-{tag}",
        "WEST": f"west-{tag}",
    }
    deployment = Deployment(root, tag, Network(f"nbo{os.getpid() % 1000}"), names)
    deployment.rabbit += [
        ["delete_vhost", names["VHOST"]],
        ["delete_user", names["CP_BROKER_USER"]],
        ["delete_user", f"nebula-cluster-{names['EAST']}"],
        ["delete_user", f"nebula-cluster-{names['WEST']}"],
    ]
    try:
        _deploy(deployment)
        yield deployment
    finally:
        if os.environ.get("NEBULA_TEST_KEEP_LOGS"):
            shutil.copytree(root / "logs", os.environ["NEBULA_TEST_KEEP_LOGS"], dirs_exist_ok=True)
        deployment.close()
        os.umask(umask)


def _deploy(deployment: Deployment) -> None:
    network, root = deployment.network, deployment.root
    ns = deployment.namespaces
    ns.update({name: network.host(name) for name in ("cp", *SITE_IPS)})
    network.link_to_root(ns["cp"], ROOT_CP, CP_ROOT, "rt")
    bridge = network.lan(ns["cp"], CP_SITE, "lan")
    # the test reaches the API as a browser on the site network would (the route goes with
    # the link)
    run("ip", "route", "add", f"{CP_SITE}/32", "via", CP_ROOT)
    for number, (name, ip) in enumerate(SITE_IPS.items()):
        network.join_lan(ns[name], ip, ns["cp"], bridge, f"l{number}")

    wheel = _build_wheel(root / "dist")
    tls = root / "tls"
    tls.mkdir()
    ca, cert, key = write_server_certificate(tls, [CP_SITE, CP2_ROOT, OLD_ROOT, "127.0.0.1"])
    deployment.ca = ca
    cp = deployment.host("cp", ns["cp"])
    _step1(cp, wheel)
    _postgres(deployment, cp)
    _rabbit_on_loopback(deployment, cp, ROOT_CP)
    _step2_database(cp)

    # RabbitMQ: the control plane's user; TLS for the clusters is a TLS listener in front
    # of the loopback port (the machine's broker has no TLS listener of its own)
    cp.sh(
        """
        BROKER_PASSWORD=$(openssl rand -hex 24)
        rabbitmqctl --quiet add_vhost "$VHOST"
        rabbitmqctl --quiet add_user "$CP_BROKER_USER" "$BROKER_PASSWORD" >/dev/null
        rabbitmqctl --quiet set_permissions -p "$VHOST" "$CP_BROKER_USER" '.*' '.*' '.*'
        printf '%s\\n' "$BROKER_PASSWORD" > "$ROOTHOME/broker-password"
        """
    )
    deployment.start(
        "cp-broker-tls",
        cp.ns.exec_argv(
            sys.executable, str(HOSTS_PY), "relay", f"{CP_SITE}:5671", "127.0.0.1:5672",
            str(cert), str(key),
        ),
    )  # fmt: skip
    _step2_control_plane(cp, ca, cert, key)
    _serve(cp, f"https://{CP_SITE}:{API_PORT}")
    deployment.api = httpx.Client(
        base_url=f"https://{CP_SITE}:{API_PORT}/api/v1", verify=tls_verify(ca), timeout=60
    )
    _steps3_to_6(deployment, cp, wheel)


def _step2_control_plane(cp: Host, ca: Path, cert: Path, key: Path) -> None:
    """deploy.md, step 2: the env files, the API's certificate, the broker's CA."""
    cp.sh(
        f"""
        install -o root -g "$U" -m 0640 {ca} "$ETC/broker-ca.pem"
        install -d -o root -g "$U" -m 0750 "$ETC/tls"
        cp {cert} "$ETC/tls/cp.crt"; cp {ca} "$ETC/tls/cp-ca.pem"; cp {key} "$ETC/tls/cp.key"
        chown root:"$U" "$ETC/tls/cp.crt" "$ETC/tls/cp-ca.pem" "$ETC/tls/cp.key"
        chmod 0640 "$ETC/tls/cp.crt" "$ETC/tls/cp-ca.pem" "$ETC/tls/cp.key"
        APP_PASSWORD=$(cat "$ROOTHOME/app-password")
        OWNER_PASSWORD=$(cat "$ROOTHOME/owner-password")
        BROKER_PASSWORD=$(cat "$ROOTHOME/broker-password")
        SECRET_KEY=$(openssl rand -hex 48)
        cd "$REPO"
        sed -e "s/APP-PASSWORD/$APP_PASSWORD/" -e "s/BROKER-PASSWORD/$BROKER_PASSWORD/" \
            -e "s/SECRET-KEY/$SECRET_KEY/" deploy/control-plane.env.example > "$ETC/control-plane.env"
        sed -e "s/OWNER-PASSWORD/$OWNER_PASSWORD/g" deploy/owner.env.example > "$ETC/owner.env"
        chown "$U:$U" "$ETC/control-plane.env" && chmod 0600 "$ETC/control-plane.env"
        chown root:root "$ETC/owner.env" && chmod 0600 "$ETC/owner.env"
        # this deployment's names and paths
        sed -i -e "s|cp.example.org|{CP_SITE}|" -e "s|^NEBULA_VAR_DIR=.*|NEBULA_VAR_DIR=$VAR|" \
            -e "s|nebula-cp:|$CP_BROKER_USER:|" -e "s|5672/nebula|5672/$VHOST|" \
            -e "s|5671/nebula|5671/$VHOST|" "$ETC/control-plane.env"
        printf '%s\\n' NEBULA_ARGON2_TIME_COST=1 NEBULA_ARGON2_MEMORY_KIB=1024 \
            NEBULA_ARGON2_PARALLELISM=1 >> "$ETC/control-plane.env"
        """
    )


def _serve(cp: Host, url: str) -> None:
    """`systemctl enable --now nebula-migrate nebula-api`: the migrations as root with both
    env files, then the API as the service user."""
    _migrate(cp)
    _start_api(cp, url)


def _migrate(cp: Host) -> str:
    """`systemctl start nebula-migrate`: as root, with both env files; what it logged."""
    migrate = subprocess.run(
        cp.ns.exec_argv(
            "env", "-i", f"PATH={cp.path('/opt/nebula/venv/bin')}:/usr/bin:/bin", "/bin/sh", "-c",
            f"set -a && . {cp.path('/etc/nebula/control-plane.env')} && "
            f". {cp.path('/etc/nebula/owner.env')} && set +a && "
            f"{cp.path('/opt/nebula/venv/bin/nebula')} db upgrade && "
            f"{cp.path('/opt/nebula/venv/bin/nebula')} db grants nebula_app | "
            "psql -q -v ON_ERROR_STOP=1",
        ),
        cwd="/", capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    # ProtectSystem=strict: the migrations write nothing the API would then not own
    strays = [p for p in cp.path("/var/lib/nebula").rglob("*") if p.owner() != cp.user]
    assert not strays, f"left by nebula-migrate as root: {strays}"
    return migrate.stdout + migrate.stderr


def _start_api(cp: Host, url: str) -> None:
    """`systemctl start nebula-api`: the API as the service user, until it is ready."""
    cp.unit(
        "api",
        ["/etc/nebula/control-plane.env"],
        f"{cp.path('/opt/nebula/venv/bin/nebula')} serve --host 0.0.0.0 --port {API_PORT} "
        f"--tls-cert {cp.path('/etc/nebula/tls/cp.crt')} "
        f"--tls-key {cp.path('/etc/nebula/tls/cp.key')}",
    )

    def ready() -> bool:
        out = cp.sh(f'curl -s --cacert "$ETC/tls/cp-ca.pem" {url}/readyz || true')
        return '"ready":true' in out.replace(" ", "")

    wait_until(ready, f"the API of {cp.name}\n{cp.deployment.log(f'{cp.name}-api')}", 120)


def _steps3_to_6(deployment: Deployment, cp: Host, wheel: Path) -> None:
    names = deployment.names
    east, west = names["EAST"], names["WEST"]
    cp.sh(cp.cp_nebula() + f"printf '%s\\n' '{PASSWORD}' | cp_nebula users create-admin {ADMIN}")

    # step 3: a token, the clusters; the API cannot make their broker users, root does
    answers = cp.sh(
        f"""
        TOKEN=$(curl -s --cacert "$ETC/tls/cp-ca.pem" https://{CP_SITE}:{API_PORT}/api/v1/auth/login \
          -H 'content-type: application/json' \
          -d '{{"email": "{ADMIN}", "password": "{PASSWORD}"}}' \
          | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')
        printf '%s\\n' "$TOKEN" > "$ROOTHOME/token"
        for site in {east}={SITE_IPS["east-gw"]} {west}={SITE_IPS["west-gw"]}; do
          curl -s --cacert "$ETC/tls/cp-ca.pem" https://{CP_SITE}:{API_PORT}/api/v1/clusters \
            -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' \
            -d "{{\\"name\\": \\"${{site%%=*}}\\", \\"switch_host\\": \\"${{site#*=}}\\", \\"switch_port\\": 7101}}"
          echo
        done
        """
    )
    registered = [json.loads(line) for line in answers.splitlines() if line.strip()]
    assert [c["name"] for c in registered] == [east, west], answers
    for cluster in registered:  # the API's user has no Erlang cookie: said, not hidden
        assert cluster["broker_user"] == "missing", cluster
        assert "rabbitmqctl" in (cluster["broker_problem"] or ""), cluster
    cp.sh(
        f"""for c in {east} {west}; do
          sh -c 'set -a && . "$ETC/control-plane.env" && exec nebula clusters broker-user "$0"' "$c"
        done"""
    )
    strays = [p for p in cp.path("/var/lib/nebula").rglob("*") if p.owner() != cp.user]
    assert not strays, f"left by `nebula clusters broker-user` as root: {strays}"
    token = cp.path("/root/token").read_text().strip()
    assert deployment.api is not None
    deployment.api.headers["Authorization"] = f"Bearer {token}"
    listed = {c["name"]: c for c in deployment.api.get("/clusters").json()["items"]}
    assert listed[east]["broker_user"] == listed[west]["broker_user"] == "ok", listed

    # step 4: the bundles, copied to each cluster's gateway and compute host
    cp.sh(
        cp.cp_nebula()
        + f"""for c in {east} {west}; do
          cp_nebula clusters bundle "$c" --out "$VAR/bundles/$c" \
            --control-plane https://{CP_SITE}:{API_PORT} --control-plane-ca "$ETC/tls/cp-ca.pem" \
            --broker-url amqps://{CP_SITE}:5671/$VHOST --broker-ca "$ETC/broker-ca.pem" >/dev/null
        done"""
    )
    site_hosts = {}
    for name in SITE_IPS:
        host = deployment.host(name, deployment.namespaces[name])
        _step1(host, wheel)
        site_hosts[name] = host
    for name, host in site_hosts.items():
        _copy_bundle(cp, east if name.startswith("east") else west, host)
    cp.sh(f'rm -r "$VAR/bundles/{east}" "$VAR/bundles/{west}"')

    # step 5: each gateway's switch; step 6: each compute host's worker
    for name, host in site_hosts.items():
        gateway = name.endswith("-gw")
        peer = f"{west}={SITE_IPS['west-gw']}" if name.startswith("east") else None
        peer = peer or f"{east}={SITE_IPS['east-gw']}"
        if gateway:
            host.sh(
                f"""
                cd "$REPO"
                sed -e 's/west=203.0.113.20:7101/{peer}:7101/' -e "s|^NEBULA_VAR_DIR=.*|NEBULA_VAR_DIR=$VAR|" \
                    deploy/cluster.env.example > "$ETC/cluster.env"
                chown "$U:$U" "$ETC/cluster.env" && chmod 0600 "$ETC/cluster.env"
                """
            )
            _start_switch(host)
        else:
            gateway_ip = SITE_IPS[name.replace("-c1", "-gw")]
            host.sh(
                f"""
                cd "$REPO"
                sed -e 's/^#NEBULA_SWITCH=.*/NEBULA_SWITCH="--switch {gateway_ip}:7201"/' -e '/^NEBULA_PEERS=/d' \
                    -e "s|^NEBULA_VAR_DIR=.*|NEBULA_VAR_DIR=$VAR|" \
                    deploy/cluster.env.example > "$ETC/cluster.env"
                chown "$U:$U" "$ETC/cluster.env" && chmod 0600 "$ETC/cluster.env"
                """
            )
            host.unit(
                "worker-1",
                ["/etc/nebula/cluster.env"],
                f"{host.path('/opt/nebula/venv/bin/nebula')} worker "
                f"--bundle {host.path('/var/lib/nebula/bundle')} --concurrency 1 "
                f"--scratch-dir {host.path('/var/lib/nebula/scratch-1')} $NEBULA_SWITCH",
            )


def _copy_bundle(cp: Host, cluster: str, host: Host) -> None:
    """deploy.md, step 4: `copy_bundle CLUSTER HOST`, the `ssh root@HOST '...'` being the
    same script run on that host as root."""
    tar = subprocess.Popen(
        ["tar", "-C", str(cp.path(f"/var/lib/nebula/bundles/{cluster}")), "-cf", "-", "."],
        stdout=subprocess.PIPE,
    )
    assert tar.stdout is not None
    copied = subprocess.run(
        host.ns.exec_argv(
            "sh", "-c",
            'install -d -o "$U" -g "$U" -m 0700 "$VAR/bundle" && '
            'tar -C "$VAR/bundle" --no-same-owner -xf - && '
            'chown -R "$U:$U" "$VAR/bundle" && chmod 0700 "$VAR/bundle" && '
            'find "$VAR/bundle" -maxdepth 1 -type f -exec chmod 0600 {} +',
        ),
        stdin=tar.stdout, env=host.shell_env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    tar.wait()
    assert copied.returncode == 0, copied.stderr


def _start_switch(host: Host) -> None:
    """`systemctl start nebula-switch` on a gateway (deploy.md, step 5)."""
    host.unit(
        "switch",
        ["/etc/nebula/cluster.env"],
        f"{host.path('/opt/nebula/venv/bin/nebula')} switch "
        f"--bundle {host.path('/var/lib/nebula/bundle')} --peer-host 0.0.0.0 "
        "--peer-port 7101 --worker-host 0.0.0.0 --worker-port 7201 $NEBULA_PEERS",
    )


def _doctor(cp: Host) -> tuple[int, str]:
    done = subprocess.run(
        cp.ns.exec_argv(
            "bash", "-c", cp.cp_nebula() + 'cp_nebula doctor --tls-cert "$ETC/tls/cp.crt"'
        ),
        env={**cp.shell_env(), "COLUMNS": "200"},
        cwd="/", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_the_clusters_come_up_and_the_demo_succeeds_against_the_deployment(
    deployment: Deployment,
) -> None:
    api, names = deployment.api, deployment.names
    assert api is not None
    cp = deployment.hosts["cp"]
    # the web UI comes from the installed wheel
    index = httpx.get(f"https://{CP_SITE}:{API_PORT}/", verify=tls_verify(deployment.ca))
    assert index.status_code == 200 and "<html" in index.text.lower(), index.text[:200]
    shipped = cp.path("/opt/nebula/venv/lib/python3.11/site-packages/app/static/index.html")
    assert index.text == shipped.read_text()

    # each cluster host holds its bundle as its own service user's, 0700 and 0600
    for name in SITE_IPS:
        host = deployment.hosts[name]
        bundle = host.path("/var/lib/nebula/bundle")
        assert bundle.owner() == host.user and bundle.stat().st_mode & 0o777 == 0o700
        for item in bundle.iterdir():
            assert item.owner() == host.user, item

    def online() -> bool:
        clusters = api.get("/clusters").json()["items"]
        mine = [c for c in clusters if c["name"] in (names["EAST"], names["WEST"])]
        return len(mine) == 2 and all(
            c["switch_online"] and c["workers_online"] == 1 and c["broker_user"] == "ok"
            for c in mine
        )

    logs = " ".join(deployment.log(p)[-1500:] for p in deployment.processes if "relay" not in p)
    wait_until(online, f"both clusters' switch and worker online\n{logs}", 180)

    # deploy.md, step 7
    demo = cp.sh(
        f"""
        printf '{{"email": "{ADMIN}", "password": "%s"}}\\n' '{PASSWORD}' > "$ROOTHOME/demo-login.json"
        chmod 0600 "$ROOTHOME/demo-login.json"
        COLUMNS=200 nebula demo --url https://{CP_SITE}:{API_PORT} --ca "$ETC/tls/cp-ca.pem" \
          --login-file "$ROOTHOME/demo-login.json" --cleanup --electra-steps 4 --abnet-steps 3
        rm "$ROOTHOME/demo-login.json"
        """
    )
    assert "The demo's users and their data were removed (--cleanup)." in demo, demo
    assert "chain verifies" in demo, demo


def test_a_second_bundle_leaves_the_running_hosts_working(deployment: Deployment) -> None:
    """deploy.md, step 4: writing a bundle again keeps the broker password, so a host that
    restarts on the bundle it has still connects (operations.md, adding a compute host)."""
    api, cp, east = deployment.api, deployment.hosts["cp"], deployment.names["EAST"]
    assert api is not None
    cp.sh(
        cp.cp_nebula()
        + f"""cp_nebula clusters bundle {east} --out "$VAR/bundles/{east}-2" \
            --control-plane https://{CP_SITE}:{API_PORT} --control-plane-ca "$ETC/tls/cp-ca.pem" \
            --broker-url amqps://{CP_SITE}:5671/$VHOST --broker-ca "$ETC/broker-ca.pem" >/dev/null
        rm -r "$VAR/bundles/{east}-2"
        """
    )
    compute = deployment.hosts["east-c1"]
    name = f"{compute.name}-worker-1"
    deployment.stop(name)  # `systemctl restart nebula-worker@1`, on the old bundle
    before = len(deployment.log_text(name))
    compute.unit(
        "worker-1",
        ["/etc/nebula/cluster.env"],
        f"{compute.path('/opt/nebula/venv/bin/nebula')} worker "
        f"--bundle {compute.path('/var/lib/nebula/bundle')} --concurrency 1 "
        f"--scratch-dir {compute.path('/var/lib/nebula/scratch-1')} $NEBULA_SWITCH",
    )

    def connected() -> bool:
        since = deployment.log_text(name)[before:]
        assert "ACCESS_REFUSED" not in since and "AccessRefused" not in since, since
        return " ready." in since and "Connected to amqps://" in since

    wait_until(connected, f"east's worker back on its old bundle\n{deployment.log(name)}", 120)


def test_doctor_is_green_then_names_the_fix_while_the_broker_is_stopped(
    deployment: Deployment,
) -> None:
    cp = deployment.hosts["cp"]
    code, out = _doctor(cp)
    assert code == 0, out
    assert "FAIL" not in out, out

    # a typo in the env file changes nothing, and says so (operations.md, Logs)
    cp.sh(
        'cp "$ETC/control-plane.env" "$ROOTHOME/env" && echo NEBULA_REAPER_INTERVAL=5 >> "$ETC/control-plane.env"'
    )
    try:
        code, out = _doctor(cp)
    finally:
        cp.sh('cp "$ROOTHOME/env" "$ETC/control-plane.env" && rm "$ROOTHOME/env"')
    assert code == 0, out
    assert (
        "unknown setting NEBULA_REAPER_INTERVAL is ignored (did you mean NEBULA_REAPER_INTERVAL_S?)"
        in out
    ), out

    deployment.stop("cp-relay-5672")  # the broker stops answering on the host's loopback
    try:
        code, out = _doctor(cp)
        assert code == 1, out
        failing = [line for line in out.splitlines() if line.startswith("FAIL")]
        assert [line.split(":")[0] for line in failing] == ["FAIL broker"], out
        assert "fix: start the broker (systemctl start rabbitmq-server)" in out, out
    finally:
        deployment.start(
            "cp-relay-5672",
            cp.ns.exec_argv(
                sys.executable, str(HOSTS_PY), "relay", "127.0.0.1:5672", f"{ROOT_CP}:5672"
            ),
        )
    wait_until(lambda: _doctor(cp)[0] == 0, "doctor green again", 60)


def _bundle_options() -> str:
    """deploy.md, step 4's options of `nebula clusters bundle`, with this deployment's names."""
    return (
        f'--control-plane https://{CP_SITE}:{API_PORT} --control-plane-ca "$ETC/tls/cp-ca.pem" '
        f'--broker-url amqps://{CP_SITE}:5671/$VHOST --broker-ca "$ETC/broker-ca.pem"'
    )


def test_doctor_names_the_renewal_of_an_expired_switch_certificate(
    deployment: Deployment,
) -> None:
    """operations.md, Certificates: east's switch was stopped past its certificate's end
    (30 days, which the test does not wait: the certificate's row is moved back by as
    much); doctor is red with the renewal, which done as written makes it green again."""
    cp, gateway, east = (
        deployment.hosts["cp"],
        deployment.hosts["east-gw"],
        deployment.names["EAST"],
    )
    deployment.stop("east-gw-switch")  # `systemctl stop nebula-switch`, for too long
    cp.sh(
        f"""runuser -u postgres -- psql -q -v ON_ERROR_STOP=1 -d nebula -c \
          "UPDATE certificates SET not_after = (now() AT TIME ZONE 'UTC') - interval '1 day'
           WHERE cluster_id = (SELECT id FROM clusters WHERE name = '{east}')
             AND revoked_at IS NULL"
        """
    )
    code, out = _doctor(cp)
    assert code == 1, out
    failing = [line.split(":")[0] for line in out.splitlines() if line.startswith("FAIL")]
    assert failing == [f"FAIL cluster {east} switch certificate"], out
    assert "switch certificate: expired on " in out, out
    assert f"fix: on the control plane: nebula clusters bundle {east} --out {east}-bundle" in out
    assert "with the options its first bundle had (--control-plane-ca, --broker-ca" in out, out
    assert "move switch.crt and switch.key out of its bundle folder" in out, out

    # the renewal, as operations.md, Certificates, says it
    cp.sh(
        cp.cp_nebula()
        + f'cp_nebula clusters bundle {east} --out "$VAR/bundles/{east}" {_bundle_options()} >/dev/null'
    )
    gateway.sh('mv "$VAR/bundle/switch.crt" "$VAR/bundle/switch.key" "$ROOTHOME/"')
    _copy_bundle(cp, east, gateway)
    cp.sh(f'rm -r "$VAR/bundles/{east}"')
    _start_switch(gateway)

    def green() -> bool:
        return _doctor(cp)[0] == 0

    wait_until(green, f"east's switch enrolled again\n{deployment.log('east-gw-switch')}", 120)
    code, out = _doctor(cp)
    assert f"ok   cluster {east} switch certificate: valid until" in out, out


def test_a_bundle_folder_of_the_wrong_owner_or_mode_is_refused_with_the_fix(
    deployment: Deployment,
) -> None:
    """deploy.md, step 4: the switch refuses a bundle that is not its user's alone, naming
    the file and the command; the commands it names, run as root, are the fix."""
    gateway = deployment.hosts["east-gw"]
    copy = gateway.path("/var/lib/nebula/bundle-copy")
    # copied as root without copy_bundle's chown: root's, 0700 (cp keeps the modes)
    gateway.sh('cp -r "$VAR/bundle" "$VAR/bundle-copy"')

    def switch() -> str:
        done = subprocess.run(
            gateway.unit_argv(
                ["/etc/nebula/cluster.env"],
                f"{gateway.path('/opt/nebula/venv/bin/nebula')} switch --bundle {copy} "
                "--peer-host 127.0.0.1 --peer-port 7102 --worker-host 127.0.0.1 --worker-port 7202",
            ),
            cwd="/", capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode != 0, done.stdout + done.stderr
        return done.stderr.strip().splitlines()[-1]

    try:
        refused = switch()
        user = gateway.user
        assert refused == (
            f"{copy} belongs to root (mode 0700) and {user} cannot read it: "
            f"as root, chown -R {user}: {copy} && chmod 0700 {copy}"
        ), refused
        gateway.sh(refused.split("as root, ", 1)[1])
        # a file of it left readable by others (a copy made with another umask)
        gateway.sh('chmod 0644 "$VAR/bundle-copy/bundle.json"')
        refused = switch()
        assert refused == (
            f"{copy}/bundle.json has mode 0644: others may read the cluster's secrets; "
            f"chmod 0600 {copy}/bundle.json"
        ), refused
        gateway.sh(refused.split("; ", 1)[1])
        assert (copy / "bundle.json").stat().st_mode & 0o777 == 0o600
    finally:
        gateway.sh('rm -r "$VAR/bundle-copy"')


def _jobs(host: Host) -> str:
    """The job history as the database holds it (the postgres user, on the host)."""
    return host.sh(
        "runuser -u postgres -- psql -d nebula -At -c "
        "'SELECT id, kind, status, step FROM jobs ORDER BY id'"
    )


def test_a_backup_restores_on_a_fresh_control_plane(deployment: Deployment) -> None:
    api, cp = deployment.api, deployment.hosts["cp"]
    assert api is not None
    workspace = api.get("/workspaces").json()["items"][0]["id"]
    content = b"una frase\tone sentence\n" * 50
    uploaded = api.post(
        f"/workspaces/{workspace}/datasets",
        data={"name": "pairs.tsv", "kind": "parallel", "discoverable": "false"},
        files={"file": ("pairs.tsv", content)},
    )
    assert uploaded.status_code == 201, uploaded.text
    dataset = uploaded.json()["id"]
    history = _jobs(cp)
    assert history.count("|succeeded|") >= 2, history  # the demo's two jobs

    # operations.md, Backup, as root on the control plane, with the API running
    backup = """
        install -d -m 0700 "$BACKUPS" && cd "$BACKUPS"
        stamp=$(date -u +%Y%m%dT%H%M%SZ)
        cp "$VAR/data/audit/anchors.jsonl" "anchors-$stamp.jsonl"
        runuser -u postgres -- pg_dump -Fc nebula > "db-$stamp.dump"
        echo "$stamp"
    """
    stamp = cp.sh(backup).strip()
    # the API goes on: an audited sign-in between the dump and the data archive (whose
    # anchors then reach past the dump)
    signed_in = api.post("/auth/login", json={"email": ADMIN, "password": PASSWORD})
    assert signed_in.status_code == 200, signed_in.text
    time.sleep(2.5)  # the anchorer signs the new head (NEBULA_AUDIT_ANCHOR_INTERVAL_S, 1 s)
    cp.sh(
        f"""
        cd "$BACKUPS" && stamp={stamp}
        tar -C "$VAR" -czf "data-$stamp.tgz" data
        install -d -m 0700 "$ROOTHOME/secret-$stamp"
        cp "$ETC/control-plane.env" "$ETC/owner.env" "$ROOTHOME/secret-$stamp/"
        cp "$VAR/audit_anchor_key" "$ROOTHOME/anchor-key-$stamp.pem"
        """
    )

    # the archive's anchors sign an event the dump lacks: restored with the dump, they would
    # read as a deleted tail; the copy taken before the dump is what goes back
    archived = cp.sh(f'tar -xzOf "$BACKUPS/data-{stamp}.tgz" data/audit/anchors.jsonl | tail -n 1')
    copied = cp.path(f"/var/backups/nebula/anchors-{stamp}.jsonl").read_text().splitlines()[-1]
    assert json.loads(archived)["seq"] > json.loads(copied)["seq"]

    # a fresh control-plane host: deploy.md steps 1 and 2 with the backup's passwords
    network = deployment.network
    ns = network.host("cp2")
    network.link_to_root(ns, ROOT_CP2, CP2_ROOT, "r2")
    fresh = deployment.host("cp2", ns)
    wheel = next((deployment.root / "dist").glob("nebula-*.whl"))
    _step1(fresh, wheel)
    _postgres(deployment, fresh)
    _rabbit_on_loopback(deployment, fresh, ROOT_CP2)
    # the backup travels to the new host (scp): its folders, and root's secret folders
    fresh.sh(
        f"""
        install -d -m 0700 "$BACKUPS" "$ROOTHOME/secret-{stamp}"
        cp {cp.path("/var/backups/nebula")}/*-{stamp}.* "$BACKUPS/"
        cp {cp.path(f"/root/secret-{stamp}")}/* "$ROOTHOME/secret-{stamp}/"
        cp {cp.path(f"/root/anchor-key-{stamp}.pem")} "$ROOTHOME/"
        """
    )
    fresh.sh(
        f"""
        OWNER_PASSWORD=$(sed -n 's/^PGPASSWORD=//p' "$ROOTHOME/secret-{stamp}/owner.env")
        APP_PASSWORD=$(sed -n 's|^NEBULA_DATABASE_URL=postgresql+psycopg://nebula_app:\\([^@]*\\)@.*|\\1|p' \\
            "$ROOTHOME/secret-{stamp}/control-plane.env")
        BROKER_PASSWORD=$(sed -n "s|^NEBULA_BROKER_URL=amqp://$CP_BROKER_USER:\\([^@]*\\)@.*|\\1|p" \\
            "$ROOTHOME/secret-{stamp}/control-plane.env")
        test -n "$OWNER_PASSWORD" && test -n "$APP_PASSWORD"
        # the machine's one RabbitMQ has the user already: its password is the backup's
        rabbitmqctl --quiet authenticate_user "$CP_BROKER_USER" "$BROKER_PASSWORD" >/dev/null
        runuser -u postgres -- psql -q -v ON_ERROR_STOP=1 \\
          -c "SET password_encryption = 'scram-sha-256'" \\
          -c "CREATE ROLE nebula_owner LOGIN PASSWORD '$OWNER_PASSWORD'" \\
          -c "CREATE ROLE nebula_app LOGIN PASSWORD '$APP_PASSWORD'" \\
          -c "CREATE DATABASE nebula OWNER nebula_owner"
        install -d -o root -g "$U" -m 0750 "$ETC/tls"
        cp {cp.path("/etc/nebula/tls")}/* "$ETC/tls/"
        chown root:"$U" "$ETC"/tls/* && chmod 0640 "$ETC"/tls/*
        """
    )
    # operations.md, Restore (the units installed, not started)
    fresh.sh(
        f"""
        STAMP={stamp}
        cp "$ROOTHOME/secret-$STAMP/control-plane.env" "$ROOTHOME/secret-$STAMP/owner.env" "$ETC/"
        chown "$U:$U" "$ETC/control-plane.env" && chown root:root "$ETC/owner.env"
        chmod 0600 "$ETC/control-plane.env" "$ETC/owner.env"
        # this host's folder in the test (on a real host, /var/lib/nebula on both)
        sed -i "s|^NEBULA_VAR_DIR=.*|NEBULA_VAR_DIR=$VAR|" "$ETC/control-plane.env"
        install -o "$U" -g "$U" -m 0600 "$ROOTHOME/anchor-key-$STAMP.pem" "$VAR/audit_anchor_key"
        runuser -u postgres -- dropdb --if-exists nebula
        runuser -u postgres -- createdb -O nebula_owner nebula
        runuser -u postgres -- pg_restore --no-owner --role=nebula_owner -d nebula < "$BACKUPS/db-$STAMP.dump"
        rm -rf "$VAR/data" && tar -C "$VAR" -xzf "$BACKUPS/data-$STAMP.tgz"
        cp "$BACKUPS/anchors-$STAMP.jsonl" "$VAR/data/audit/anchors.jsonl"
        chown -R "$U:$U" "$VAR/data"
        """
    )
    _serve(fresh, f"https://127.0.0.1:{API_PORT}")
    verified = fresh.sh(fresh.cp_nebula() + "cp_nebula audit verify")
    assert "audit chain ok" in verified, verified
    code, out = _doctor(fresh)
    assert code == 0, out

    assert _jobs(fresh) == history
    restored = httpx.Client(
        base_url=f"https://{CP2_ROOT}:{API_PORT}/api/v1", verify=tls_verify(deployment.ca)
    )
    login = restored.post("/auth/login", json={"email": ADMIN, "password": PASSWORD})
    assert login.status_code == 200, login.text
    restored.headers["Authorization"] = f"Bearer {login.json()['token']}"
    download = restored.get(f"/datasets/{dataset}/content")
    assert download.status_code == 200, download.text
    assert download.content == content


OLD_ADMIN = "first@example.org"


def _first_release_rows() -> tuple[str, str]:
    """SQL for what a control plane at migration 0001 (before the keyed audit chain) kept: an
    admin, a workspace, and audit events chained by plain sha256, with no anchor file; and
    the workspace's id."""
    from passlib.hash import argon2

    from app.audit.models import AuditEvent
    from app.audit.service import GENESIS_HASH, legacy_chain_hash

    def literal(value: object) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, bool | int):
            return str(value).lower() if isinstance(value, bool) else str(value)
        return "'" + str(value).replace("'", "''") + "'"

    at = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=400)
    user, workspace = str(uuid.uuid4()), str(uuid.uuid4())
    password_hash = argon2.using(type="ID", rounds=1, memory_cost=1024, parallelism=1).hash(
        PASSWORD
    )
    rows = [
        "INSERT INTO users (id, email, display_name, role, status, password_hash, created_at, "
        f"updated_at) VALUES ({literal(user)}, {literal(OLD_ADMIN)}, 'First', 'admin', "
        f"'active', {literal(password_hash)}, {literal(at)}, {literal(at)})",
        "INSERT INTO workspaces (id, owner_id, name, is_personal, storage_bytes_used, "
        f"storage_bytes_limit, max_concurrent_jobs, created_at) VALUES ({literal(workspace)}, "
        f"{literal(user)}, 'Personal', true, 0, 10737418240, 2, {literal(at)})",
    ]
    prev = GENESIS_HASH
    for seq, (action, subject_type, subject_id) in enumerate(
        [("user.create", "user", user), ("workspace.create", "workspace", workspace),
         ("auth.login", "user", user)],
        start=1,
    ):  # fmt: skip
        event = AuditEvent(
            id=str(uuid.uuid4()), seq=seq, at=at + timedelta(seconds=seq), actor_id=None,
            action=action, subject_type=subject_type, subject_id=subject_id,
            outcome="success", ip=None, details={"release": "0001"}, prev_hash=prev,
        )  # fmt: skip
        event.hash = prev = legacy_chain_hash(prev, event)
        values = [
            event.id, seq, event.at, None, action, subject_type, subject_id, "success", None,
            json.dumps(event.details), event.prev_hash, event.hash,
        ]  # fmt: skip
        rows.append(
            "INSERT INTO audit_events (id, seq, at, actor_id, action, subject_type, subject_id, "
            "outcome, ip, details, prev_hash, hash) VALUES ("
            + ", ".join(literal(v) for v in values)
            + ")"
        )
    return "".join(row + ";\n" for row in rows), workspace


def test_an_upgrade_from_the_first_migration_keeps_the_data(deployment: Deployment) -> None:
    """operations.md, Upgrade, on a control plane whose database a release at the first
    migration made and used: migrated as the owner, grants re-applied, the unkeyed audit
    chain adopted once, served; the data is there and the new release works on it."""
    cp, network = deployment.hosts["cp"], deployment.network
    ns = network.host("old")
    network.link_to_root(ns, ROOT_OLD, OLD_ROOT, "r3")
    old = deployment.host("old", ns)
    _step1(old, next((deployment.root / "dist").glob("nebula-*.whl")))
    _postgres(deployment, old)
    _rabbit_on_loopback(deployment, old, ROOT_OLD)
    _step2_database(old)
    shutil.copy(cp.path("/root/broker-password"), old.path("/root/broker-password"))
    tls = deployment.root / "tls"
    _step2_control_plane(old, tls / "tls-ca.pem", tls / "tls.crt", tls / "tls.key")

    # the first release: its `nebula db upgrade` (migration 0001, no anchor), its grants,
    # and what its API wrote
    rows, workspace = _first_release_rows()
    old.sh(
        """
        set -a && . "$ETC/control-plane.env" && . "$ETC/owner.env" && set +a
        "$OPT/venv/bin/python" -c 'import os; from app.migrate import upgrade; upgrade(os.environ["NEBULA_DATABASE_URL"], "0001")'
        nebula db grants nebula_app | psql -q -v ON_ERROR_STOP=1
        psql -q -v ON_ERROR_STOP=1
        """,
        stdin=rows,
    )
    assert not old.path("/var/lib/nebula/data/audit/anchors.jsonl").exists()

    # operations.md, Upgrade, step 3 (the venv already holds the new wheel: step 1 above)
    migrated = _migrate(old)
    assert "nebula audit adopt" in migrated, migrated  # what the release before lacked
    adopted = old.sh(old.cp_nebula() + "cp_nebula audit adopt")
    assert "events 1..3 kept as an unkeyed chain" in adopted, adopted
    _start_api(old, f"https://127.0.0.1:{API_PORT}")
    code, out = _doctor(old)
    assert code == 0, out
    verified = old.sh(old.cp_nebula() + "cp_nebula audit verify")
    assert "audit chain ok" in verified, verified

    api = httpx.Client(
        base_url=f"https://{OLD_ROOT}:{API_PORT}/api/v1", verify=tls_verify(deployment.ca)
    )
    login = api.post("/auth/login", json={"email": OLD_ADMIN, "password": PASSWORD})
    assert login.status_code == 200, login.text
    api.headers["Authorization"] = f"Bearer {login.json()['token']}"
    workspaces = api.get("/workspaces").json()["items"]
    assert [w["id"] for w in workspaces] == [workspace], workspaces
    content = b"una frase\tone sentence\n" * 10
    uploaded = api.post(
        f"/workspaces/{workspace}/datasets",
        data={"name": "pairs.tsv", "kind": "parallel", "discoverable": "false"},
        files={"file": ("pairs.tsv", content)},
    )
    assert uploaded.status_code == 201, uploaded.text
    download = api.get(f"/datasets/{uploaded.json()['id']}/content")
    assert download.status_code == 200 and download.content == content, download.text
    events = api.get("/audit", params={"action": "user.create"}).json()["items"]
    assert [(e["seq"], e["subject_email"]) for e in events] == [(1, OLD_ADMIN)], events
    verified = old.sh(old.cp_nebula() + "cp_nebula audit verify")
    assert "audit chain ok" in verified, verified
