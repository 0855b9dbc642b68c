"""The machine's services a test may need: PostgreSQL (a migrated template cloned per test),
Redis and RabbitMQ, and the one way to report one missing (skip, or fail under CI)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from sqlalchemy import text

from app.db import make_engine
from app.migrate import upgrade

REQUIRE_SERVICES = os.environ.get("NEBULA_TEST_REQUIRE_SERVICES") == "1"
POSTGRES_ADMIN_URL = os.environ.get(
    "NEBULA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
# each pytest-xdist worker (gw0, gw1, ...) flushes a Redis database of its own
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
REDIS_URL = os.environ.get("NEBULA_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - _WORKER % 8}")
RABBITMQ_URL = os.environ.get("NEBULA_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")


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


def rabbitmqctl(*args: str) -> None:
    """`rabbitmqctl` on the machine's RabbitMQ; raises when it fails."""
    subprocess.run(["rabbitmqctl", "--quiet", *args], check=True, capture_output=True, timeout=60)
