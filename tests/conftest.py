"""Shared fixtures: real databases (SQLite and PostgreSQL), the app, users."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.db import make_engine
from app.main import create_app
from app.migrate import upgrade
from app.settings import Settings
from support import Platform

REQUIRE_SERVICES = os.environ.get("NEBULA_TEST_REQUIRE_SERVICES") == "1"
POSTGRES_ADMIN_URL = os.environ.get(
    "NEBULA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
# each pytest-xdist worker (gw0, gw1, ...) flushes a Redis database of its own
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
REDIS_URL = os.environ.get("NEBULA_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - _WORKER % 8}")


def service_unavailable(what: str, exc: Exception) -> None:
    """Skip with a clear reason, or fail when CI requires the services."""
    message = f"{what} is not reachable ({type(exc).__name__}: {exc})"
    if REQUIRE_SERVICES:
        pytest.fail(message + " and NEBULA_TEST_REQUIRE_SERVICES=1", pytrace=False)
    pytest.skip(message + "; set NEBULA_TEST_REQUIRE_SERVICES=1 to make this an error")


def _pg_url(database: str) -> str:
    return POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/" + database


class PostgresTemplates:
    """A migrated template database, cloned into a fresh database per test."""

    def __init__(self) -> None:
        self.admin = make_engine(POSTGRES_ADMIN_URL).execution_options(isolation_level="AUTOCOMMIT")
        self.template = f"nebula_tmpl_{os.getpid()}"
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{self.template}"'))
        upgrade(_pg_url(self.template))
        self.created: list[str] = []

    def fresh(self) -> str:
        name = f"nebula_t_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        self.created.append(name)
        return _pg_url(name)

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)'))
        self.admin.dispose()


@pytest.fixture(scope="session")
def pg_templates() -> Iterator[PostgresTemplates | Exception]:
    try:
        templates = PostgresTemplates()
    except Exception as exc:  # reported per test by service_unavailable
        yield exc
        return
    yield templates
    templates.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    sqlite_template: Path,
    pg_templates: PostgresTemplates | Exception,
) -> Iterator[str]:
    """A freshly migrated, empty database of each kind."""
    if request.param == "sqlite":
        path = tmp_path / "nebula.db"
        path.write_bytes(sqlite_template.read_bytes())
        yield f"sqlite:///{path}"
        return
    if isinstance(pg_templates, Exception):
        service_unavailable("PostgreSQL", pg_templates)
        return
    url = pg_templates.fresh()
    yield url
    pg_templates.drop(url)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    """Settings for one test: its own database and folders, cheap argon2 parameters."""
    return Settings(
        var_dir=tmp_path / "var",
        database_url=database_url,
        secret_key="test-secret-key-not-for-production",  # type: ignore[arg-type]
        argon2_time_cost=1,
        argon2_memory_kib=1024,
        argon2_parallelism=1,
        run_reaper=False,
        # the authorization matrices make a workspace per row; tests/security tries the quota
        default_user_max_workspaces=1000,
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings)
    with TestClient(app) as test_client:
        yield test_client
    app.state.engine.dispose()


@pytest.fixture
def db_factory(client: TestClient) -> sessionmaker[Session]:
    """Sessions on the same database the app uses."""
    factory: sessionmaker[Session] = client.app.state.sessionmaker  # type: ignore[attr-defined]
    return factory


@pytest.fixture
def platform(client: TestClient, settings: Settings) -> Platform:
    return Platform(client, settings)
