"""Running the Alembic migrations from code (CLI, `nebula up`, tests)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from alembic import command
from alembic.config import Config

from app.settings import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config for `url` that does not depend on the working directory."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head", *, settings: Settings | None = None) -> None:
    """Bring the database at `url` to `revision`.

    `settings` give the platform secret to migrations that need it (0012 seals rows);
    without them such a migration reads the environment's settings.
    """
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # an empty file is an empty database; SQLite gives its -wal and -shm files its mode
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    cfg = alembic_config(url)
    if settings is not None:
        cfg.attributes["settings"] = settings
    command.upgrade(cfg, revision)


def downgrade(url: str, revision: str) -> None:
    """Take the database at `url` back to `revision`."""
    command.downgrade(alembic_config(url), revision)
