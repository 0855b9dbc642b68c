"""A whole platform for orchestration tests: PostgreSQL, Redis, the API with its reaper,
two switches enrolled through the CA, and one real Celery worker process per cluster."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import REDIS_URL, PostgresTemplates, service_unavailable

from app.accounts import service as accounts
from app.accounts.models import Role
from app.audit.service import SYSTEM, use_chain_key
from app.clusters import service as clusters
from app.db import make_engine, make_sessionmaker
from app.pki import service as pki
from app.settings import Settings
from support import PASSWORD, LiveServer
from workers.ports import free_port
from workers.switch import agent
from workers.switch.tls import write_private_file
from workers.worker_state import credential_path

REPO = Path(__file__).resolve().parents[3]
CLUSTERS = ("cluster-a", "cluster-b")


@dataclass
class User:
    """A signed-in user of the running platform."""

    id: str
    email: str
    client: httpx.Client
    workspace: str = ""

    def call(self, method: str, path: str, expect: int | None = None, **kwargs: Any) -> Any:
        answer = self.client.request(method, f"/api/v1{path}", **kwargs)
        if expect is not None:
            assert answer.status_code == expect, (
                f"{method} {path}: {answer.status_code} {answer.text}"
            )
        return answer.json() if answer.content else None


@dataclass
class RunningPlatform:
    settings: Settings
    server: LiveServer
    factory: Any
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    worker_argv: dict[str, list[str]] = field(default_factory=dict)
    worker_env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path()

    def user(self, name: str) -> User:
        email = f"{name}-{uuid.uuid4().hex[:6]}@example.org"
        with self.factory() as db:
            created = accounts.create_user(
                db,
                actor=SYSTEM,
                email=email,
                display_name=name,
                role=Role.member,
                password=PASSWORD,
                settings=self.settings,
            )
            db.commit()
        client = httpx.Client(base_url=self.server.url, timeout=60)
        token = client.post(
            "/api/v1/auth/login", json={"email": email, "password": PASSWORD}
        ).json()["token"]
        client.cookies.clear()
        client.headers["Authorization"] = f"Bearer {token}"
        user = User(created.id, email, client)
        user.workspace = user.call("GET", "/workspaces", 200)["items"][0]["id"]
        return user

    def start_worker(self, cluster: str) -> None:
        log = (self.log_dir / f"worker-{cluster}.log").open("ab")
        self.workers[cluster] = subprocess.Popen(
            self.worker_argv[cluster],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.worker_env,
            cwd=REPO,
        )


def wait_until(
    check: Callable[[], Any], what: str | Callable[[], str], timeout: float = 180.0
) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        tick.wait(0.25)
    described = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {described}")


@pytest.fixture(scope="package")
def running(
    pg_templates: PostgresTemplates | Exception, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningPlatform]:
    if isinstance(pg_templates, Exception):
        service_unavailable("PostgreSQL", pg_templates)
        raise AssertionError("unreachable")
    try:
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
    except Exception as exc:
        service_unavailable("Redis", exc)
    url = pg_templates.fresh()
    with platform_on(url, REDIS_URL, tmp_path_factory.mktemp("platform") / "var") as platform:
        yield platform
    pg_templates.drop(url)


@contextlib.contextmanager
def platform_on(
    url: str, broker_url: str, var: Path, **overrides: Any
) -> Iterator[RunningPlatform]:
    """The control plane on database `url` (migrated) and the broker, two switches, two workers;
    `overrides` are further settings of the control plane (a data folder of the test's own)."""
    settings = Settings(
        var_dir=var,
        database_url=url,
        broker_url=broker_url,
        secret_key="orchestration-test-secret",  # type: ignore[arg-type]
        argon2_time_cost=1,
        argon2_memory_kib=1024,
        argon2_parallelism=1,
        reaper_interval_s=0.5,
        heartbeat_timeout_s=8.0,
        presence_report_s=1.0,
        presence_timeout_s=4.0,
        **overrides,
    )
    engine = use_chain_key(make_engine(url), settings)
    factory = make_sessionmaker(engine)
    ports = {name: (free_port(), free_port()) for name in CLUSTERS}
    tokens, credentials = {}, {}
    with factory() as db:
        for name, (peer_port, _) in ports.items():
            cluster = clusters.create(
                db, actor=SYSTEM, name=name, switch_host="127.0.0.1", switch_port=peer_port
            )
            _row, tokens[name] = pki.create_enrollment_token(
                db, actor=SYSTEM, cluster=cluster, ttl=timedelta(minutes=10)
            )
            _cred, secret = clusters.create_worker_credential(db, actor=SYSTEM, cluster=cluster)
            write_private_file(credential_path(var, name), secret.encode())
            credentials[name] = secret
        db.commit()
    with LiveServer(settings) as server:
        # what a cluster host has: the control plane's URL, its broker, its own credentials;
        # neither the database URL nor the platform secret
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")},
            "NEBULA_VAR_DIR": str(var),
            "NEBULA_BROKER_URL": broker_url,
            "NEBULA_CONTROL_PLANE_URL": server.url,
            "OMP_NUM_THREADS": "1",
        }
        stop = threading.Event()
        switches = []
        for name, (peer_port, worker_port) in ports.items():
            other = next(n for n in CLUSTERS if n != name)
            thread = threading.Thread(
                target=agent.run,
                kwargs=dict(
                    cluster=name,
                    folder=var / "clusters" / name,
                    control_plane=server.url,
                    enroll_token=tokens[name],
                    worker_address=("127.0.0.1", worker_port),
                    peer_address=("127.0.0.1", peer_port),
                    peers={other: ("127.0.0.1", ports[other][0])},
                    shaper=None,
                    metrics_address=None,
                    credential=credentials[name],
                    stop=stop,
                ),
                daemon=True,
            )
            thread.start()
            switches.append(thread)
        for name in CLUSTERS:
            wait_until(
                (var / "clusters" / name / "switch.json").exists, f"the switch of {name}", 60
            )
        platform = RunningPlatform(settings, server, factory, worker_env=env, log_dir=var)
        for name in CLUSTERS:
            platform.worker_argv[name] = [
                sys.executable,
                "-m",
                "cli",
                "worker",
                "--cluster",
                name,
                "--concurrency",
                "2",
            ]
            platform.start_worker(name)
        try:
            yield platform
        finally:
            for process in platform.workers.values():
                process.send_signal(signal.SIGTERM)
            for process in platform.workers.values():
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
            stop.set()
            for thread in switches:
                thread.join(timeout=20)
    engine.dispose()
