"""Running the Alembic migrations from code (CLI, `nebula up`, tests)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from alembic import command
from alembic.config import Config

# inside the installed package (a wheel: setup.py copies migrations/ to app/migrations),
# else the checkout's
_PACKAGED = Path(__file__).resolve().parent / "migrations"
MIGRATIONS_DIR = (
    _PACKAGED
    if (_PACKAGED / "env.py").is_file()
    else Path(__file__).resolve().parent.parent / "migrations"
)


def alembic_config(url: str) -> Config:
    """An Alembic config for `url` that does not depend on the working directory."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision`."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # an empty file is an empty database; SQLite gives its -wal and -shm files its mode
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Take the database at `url` back to `revision`."""
    command.downgrade(alembic_config(url), revision)
