"""Test helpers shared across modules: accounts made the way the CLI makes them."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.accounts import service as accounts
from app.accounts.models import Role
from app.audit import service as audit
from app.audit.anchor import Anchor
from app.audit.service import SYSTEM
from app.settings import Settings

PASSWORD = "violet-harbor-cinnamon-42"


@dataclass
class Account:
    """A user of the test platform with a live session token."""

    id: str
    email: str
    role: Role
    token: str
    password: str = PASSWORD
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def make_user(
    factory: sessionmaker[Session], settings: Settings, *, email: str, role: Role = Role.member
) -> str:
    """A user made the way the CLI makes one, with the shared test password; returns its id."""
    with factory() as db:
        user = accounts.create_user(
            db,
            actor=SYSTEM,
            email=email,
            display_name=email.split("@")[0],
            role=role,
            password=PASSWORD,
            settings=settings,
        )
        db.commit()
        return user.id


class Platform:
    """Makes users the way the CLI does, and logs them in through the API."""

    def __init__(self, client: TestClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.factory: sessionmaker[Session] = client.app.state.sessionmaker  # type: ignore[attr-defined]

    def user(self, role: Role = Role.member, email: str | None = None) -> Account:
        email = email or f"{role.value}-{uuid.uuid4().hex[:8]}@example.org"
        user_id = make_user(self.factory, self.settings, email=email, role=role)
        return Account(id=user_id, email=email, role=role, token=self.login(email))

    def login(self, email: str, password: str = PASSWORD) -> str:
        answer = self.client.post("/api/v1/auth/login", json={"email": email, "password": password})
        assert answer.status_code == 200, answer.text
        self.client.cookies.clear()  # tests choose bearer or cookie explicitly
        token: str = answer.json()["token"]
        return token


def model_file_bytes(tag: str = "test") -> bytes:
    """A small safetensors file that passes the `model` dataset check (Nebula metadata)."""
    import numpy as np
    from safetensors.numpy import save

    return save({"w": np.zeros((2, 2), dtype=np.float32)}, metadata={"nebula": tag})


def anchor_now(platform: Platform) -> Anchor:
    """Sign the audit chain's head now, as the anchorer does every second."""
    with platform.factory() as db:
        anchor = audit.anchor_head(db, settings=platform.settings)
    assert anchor is not None
    return anchor


def disable_audit_triggers(factory: sessionmaker[Session]) -> None:
    """What someone with rights over the database can do before editing audit rows."""
    with factory() as db:
        if db.get_bind().dialect.name == "postgresql":
            db.execute(text("ALTER TABLE audit_events DISABLE TRIGGER USER"))
        else:
            db.execute(text("DROP TRIGGER audit_events_no_update"))
            db.execute(text("DROP TRIGGER audit_events_no_delete"))
        db.commit()


def cli_env(settings: Settings) -> dict[str, str]:
    """The environment of a `nebula` command run against the same platform as `settings`."""
    assert settings.secret_key is not None
    return {
        "NEBULA_DATABASE_URL": settings.resolved_database_url,
        "NEBULA_VAR_DIR": str(settings.var_dir),
        "NEBULA_DATA_DIR": str(settings.resolved_data_dir),
        "NEBULA_SECRET_KEY": settings.secret_key.get_secret_value(),
        "PATH": "/usr/bin:/bin",
    }


class LiveServer:
    """The control plane served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, settings: Settings) -> None:
        import socket

        import uvicorn

        from app.main import create_app

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        import threading
        import time

        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the control plane did not start")
            self.thread.join(timeout=0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.app.state.engine.dispose()


class NebulaUp:
    """`nebula up` in a folder of its own, as a user runs it: SQLite, the embedded broker."""

    def __init__(self, folder: Path) -> None:
        import socket

        self.folder = folder
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            key: value for key, value in os.environ.items() if not key.startswith("NEBULA_")
        }
        self.env.update(NEBULA_ARGON2_TIME_COST="1", NEBULA_ARGON2_MEMORY_KIB="1024")

    def command(self, *args: str) -> list[str]:
        """argv of a `nebula` subcommand with this interpreter."""
        return [sys.executable, "-m", "cli", *args]

    def __enter__(self) -> NebulaUp:
        import subprocess
        import threading
        import time

        self.folder.mkdir(parents=True, exist_ok=True)
        self.log = (self.folder / "up.log").open("wb")
        self.process = subprocess.Popen(
            self.command("up", "--port", str(self.port)),
            cwd=self.folder,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        ready = self.folder / "var" / "logs"
        deadline = time.monotonic() + 120
        tick = threading.Event()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nebula up exited: {(self.folder / 'up.log').read_text()}")
            if b"Nebula is up" in (self.folder / "up.log").read_bytes() and ready.exists():
                return self
            tick.wait(0.2)
        raise RuntimeError("nebula up did not come up in 120 s")

    @property
    def admin(self) -> dict[str, str]:
        """The demo admin's login that `nebula up` wrote."""
        import json

        login: dict[str, str] = json.loads((self.folder / "var" / "demo-admin.json").read_text())
        return login

    def __exit__(self, *exc: object) -> None:
        import signal
        import subprocess

        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


def register_clusters(factory: sessionmaker[Session], settings: Settings, *names: str) -> None:
    """Clusters whose switches hold valid certificates (keys made here, as a switch would)."""
    from app.clusters import service as clusters
    from app.pki import service as pki
    from workers.switch.tls import make_switch_key_and_csr

    with factory() as db:
        for name in names:
            cluster = clusters.create(
                db, actor=SYSTEM, name=name, switch_host="127.0.0.1", switch_port=1
            )
            _key, csr = make_switch_key_and_csr(name)
            pki.issue(db, actor=SYSTEM, cluster=cluster, csr_pem=csr.decode(), settings=settings)
        db.commit()


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "256k") mounted at `folder` for the block; skips where mounting
    is not allowed."""
    import subprocess

    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@dataclass
class ServeProcess:
    """A `nebula serve` process of a test, on its port, logging to `log_path`."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def nebula_serve(
    var: Path, log_path: Path, *, workers: int = 1, env_extra: dict[str, str] | None = None
) -> Iterator[ServeProcess]:
    """`nebula serve` on a free port over the (migrated) var folder `var`, its own process
    (session) with the test's argon2 costs and `env_extra` (more NEBULA_* settings); yields
    once every worker has started."""
    import signal
    import threading
    import time

    from workers.ports import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")}
    env.update(
        NEBULA_VAR_DIR=str(var), NEBULA_ARGON2_TIME_COST="1", NEBULA_ARGON2_MEMORY_KIB="1024"
    )
    env.update(env_extra or {})
    argv = [sys.executable, "-m", "cli", "serve", "--port", str(port), "--workers", str(workers)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        tick = threading.Event()
        deadline = time.monotonic() + 90
        while log_path.read_text().count("Application startup complete") < workers:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            tick.wait(0.2)
        yield ServeProcess(process, port, log_path)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
