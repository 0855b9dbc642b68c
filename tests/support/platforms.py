"""The platform of an in-process test: users made the way the CLI makes them and signed in
through the API, model files to upload, the audit chain's anchor, `nebula` commands' env."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import httpx
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
    factory: sessionmaker[Session],
    settings: Settings,
    *,
    email: str,
    role: Role = Role.member,
    display_name: str | None = None,
) -> str:
    """A user made the way the CLI makes one, with the shared test password; returns its id."""
    with factory() as db:
        user = accounts.create_user(
            db,
            actor=SYSTEM,
            email=email,
            display_name=display_name or email.split("@")[0],
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
        return login(self.client, email, password)


def login(client: TestClient | httpx.Client, email: str, password: str = PASSWORD) -> str:
    """Sign in through the API; returns the session token, with no cookie left on `client`."""
    answer = client.post("/api/v1/auth/login", json={"email": email, "password": password})
    assert answer.status_code == 200, answer.text
    client.cookies.clear()  # tests choose bearer or cookie explicitly
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
