"""The Alembic migrations and the ORM models describe the same schema, on both databases."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app.db import make_engine
from app.migrate import downgrade, upgrade
from app.models import Base


def _drift(url: str) -> list[object]:
    engine = make_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    return list(diff)


def test_models_and_migrations_agree(database_url: str) -> None:
    assert _drift(database_url) == []


def test_migrations_go_down_and_up_again(database_url: str) -> None:
    downgrade(database_url, "base")
    assert _drift(database_url) != []  # everything is gone
    upgrade(database_url)
    assert _drift(database_url) == []
