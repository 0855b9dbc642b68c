"""Alembic environment: the URL comes from Nebula's settings unless the caller passes one."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from app.db import make_engine
from app.models import Base
from app.settings import get_settings

config = context.config
target_metadata = Base.metadata


def run_with(connection: Connection) -> None:
    """Run the migrations on an open connection."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate the configured database (or the connection handed in through attributes)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        run_with(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url
    engine = make_engine(url)
    with engine.connect() as conn:
        run_with(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `nebula db upgrade`")
run_online()
