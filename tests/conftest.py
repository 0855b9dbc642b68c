"""Shared fixtures: real databases (SQLite and PostgreSQL), the app, users."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.main import create_app
from app.migrate import upgrade
from app.settings import Settings
from support.platforms import Platform
from support.services import PostgresTemplates, service_unavailable


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
