"""`nebula up`: the whole platform on one machine, with the embedded defaults.

SQLite and the filesystem broker under the var folder, the API and web UI, and
two demo clusters, each with a switch enrolled through the CA and a real Celery
worker process. The cluster processes start as they would on a cluster host: with
the control plane's URL, their own credentials and the CA certificate, and an
environment that holds neither the database URL nor the platform secret. Children
that die are started again; Ctrl-C stops everything.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
from sqlalchemy import select

from app.accounts import service as accounts
from app.accounts.models import Role, User
from app.audit.service import SYSTEM, use_chain_key
from app.clusters import service as clusters
from app.db import make_engine, make_sessionmaker
from app.migrate import upgrade
from app.pki import service as pki
from app.settings import Settings
from common.broker import broker_options
from common.private_files import write_private_file
from workers.ports import free_port
from workers.settings import CONTROL_PLANE_ONLY
from workers.switch_agent import SwitchFiles
from workers.worker_state import credential_path

DEMO_ADMIN_EMAIL = "admin@nebula.demo"
DEMO_CLUSTERS = ("cluster-a", "cluster-b")


def demo_admin_path(settings: Settings) -> Path:
    """Where `nebula up` leaves the demo admin's login for `nebula demo`."""
    return settings.var_dir / "demo-admin.json"


def ensure_demo_admin(settings: Settings) -> dict[str, str]:
    """The demo admin's login, created (with a random password) on first start."""
    path = demo_admin_path(settings)
    if path.exists():
        login: dict[str, str] = json.loads(path.read_text())
        return login
    password = secrets.token_urlsafe(18)
    engine = use_chain_key(make_engine(settings.resolved_database_url), settings)
    with make_sessionmaker(engine)() as db:
        if db.scalar(select(User.id).where(User.email == DEMO_ADMIN_EMAIL)) is None:
            accounts.create_user(
                db,
                actor=SYSTEM,
                email=DEMO_ADMIN_EMAIL,
                display_name="Demo admin",
                role=Role.admin,
                password=password,
                settings=settings,
            )
            db.commit()
        else:
            raise SystemExit(
                f"{DEMO_ADMIN_EMAIL} exists but {path} is gone; reset {settings.var_dir}"
            )
    engine.dispose()
    write_private_file(path, json.dumps({"email": DEMO_ADMIN_EMAIL, "password": password}).encode())
    return {"email": DEMO_ADMIN_EMAIL, "password": password}


@dataclass
class ClusterPlan:
    """Ports and enrollment of one demo cluster."""

    name: str
    peer_port: int
    worker_port: int
    folder: Path
    enroll_token: str | None
    credential_file: Path


def plan_clusters(settings: Settings) -> list[ClusterPlan]:
    """Register the demo clusters (once) and mint enrollment tokens for switches not enrolled."""
    state_file = settings.var_dir / "clusters" / "ports.json"
    ports: dict[str, list[int]] = json.loads(state_file.read_text()) if state_file.exists() else {}
    plans = []
    engine = use_chain_key(make_engine(settings.resolved_database_url), settings)
    with make_sessionmaker(engine)() as db:
        for name in DEMO_CLUSTERS:
            peer_port, worker_port = ports.get(name) or (free_port(), free_port())
            ports[name] = [peer_port, worker_port]
            cluster = clusters.by_name(db, name=name) or clusters.create(
                db, actor=SYSTEM, name=name, switch_host="127.0.0.1", switch_port=peer_port
            )
            cluster.switch_port = peer_port
            folder = settings.var_dir / "clusters" / name
            token = None
            if not SwitchFiles(folder).enrolled():
                _row, token = pki.create_enrollment_token(
                    db, actor=SYSTEM, cluster=cluster, ttl=timedelta(minutes=10)
                )
            credential_file = credential_path(settings.var_dir, name)
            if not credential_file.exists():
                _cred, secret = clusters.create_worker_credential(db, actor=SYSTEM, cluster=cluster)
                write_private_file(credential_file, (secret + "\n").encode())
            db.commit()
            plans.append(ClusterPlan(name, peer_port, worker_port, folder, token, credential_file))
    engine.dispose()
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps(ports))
    return plans


class Supervisor:
    """Starts child processes and starts again any that dies, until told to stop."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, tuple[list[str], subprocess.Popen[bytes], dict[str, str]]] = {}
        self.stopping = False

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        env = env if env is not None else os.environ.copy()
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.children[name] = (argv, process, env)

    def watch(self) -> None:
        """Restart children that exited; returns when stop() is called."""
        while not self.stopping:
            for name, (argv, process, env) in list(self.children.items()):
                if process.poll() is not None and not self.stopping:
                    print(f"  {name} exited ({process.returncode}); starting it again", flush=True)
                    self.start(name, argv, env)
            time.sleep(1.0)

    def stop(self) -> None:
        self.stopping = True
        for _argv, process, _env in self.children.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 15
        for _argv, process, _env in self.children.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


def cluster_environment(settings: Settings, control_plane: str) -> dict[str, str]:
    """What a cluster process starts with: this environment without the control plane's
    database URL and secret, and the control plane's URL."""
    env = {k: v for k, v in os.environ.items() if k not in CONTROL_PLANE_ONLY}
    env["NEBULA_VAR_DIR"] = str(settings.var_dir)
    env["NEBULA_CONTROL_PLANE_URL"] = control_plane
    if settings.broker_url:
        env["NEBULA_BROKER_URL"] = settings.broker_url
    return env


def _nebula(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


def _wait_for(check: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not come up within {timeout:.0f} s (see the logs under var/logs)")


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise SystemExit(
                f"port {port} on {host} is taken; choose another with --port"
            ) from None


def up(settings: Settings, *, host: str, port: int) -> int:
    """Run everything until interrupted."""
    _check_port_free(host, port)
    settings.var_dir.mkdir(parents=True, exist_ok=True)
    settings.secret()
    upgrade(settings.resolved_database_url, settings=settings)
    # makes the embedded broker's folders before anyone polls them
    broker_options(settings.broker_url, settings.var_dir)
    admin = ensure_demo_admin(settings)
    plans = plan_clusters(settings)
    url = f"http://{host}:{port}"
    supervisor = Supervisor(settings.var_dir / "logs")
    cluster_env = cluster_environment(settings, url)

    def shutdown(*_: object) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    try:
        supervisor.start("api", _nebula("serve", "--host", host, "--port", str(port)))
        _wait_for(lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, "the API")
        for plan in plans:
            (plan.folder / "switch.json").unlink(missing_ok=True)
            others = [p for p in plans if p is not plan]
            argv = _nebula(
                "switch",
                "--cluster",
                plan.name,
                "--control-plane",
                url,
                "--worker-port",
                str(plan.worker_port),
                "--peer-port",
                str(plan.peer_port),
                *[a for o in others for a in ("--peer", f"{o.name}=127.0.0.1:{o.peer_port}")],
            )
            argv += ["--credential-file", str(plan.credential_file)]
            if plan.enroll_token:
                argv += ["--enroll-token", plan.enroll_token]
            supervisor.start(f"switch-{plan.name}", argv, cluster_env)
        for plan in plans:
            _wait_for((plan.folder / "switch.json").exists, f"the switch of {plan.name}")
            supervisor.start(
                f"worker-{plan.name}", _nebula("worker", "--cluster", plan.name), cluster_env
            )
        print(
            f"\nNebula is up: {url}\n"
            f"  demo admin: {admin['email']}  password: {admin['password']}\n"
            f"  clusters: {', '.join(p.name for p in plans)} (switches enrolled through the CA)\n"
            f"  logs: {settings.var_dir / 'logs'}\n"
            f"  try: nebula demo   (Ctrl-C stops everything)\n",
            flush=True,
        )
        supervisor.watch()
    finally:
        supervisor.stop()
    return 0
