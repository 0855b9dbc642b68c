"""Running the Alembic migrations from code (CLI, `nebula up`, tests)."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from alembic import command
from alembic.config import Config

from app.settings import Settings

log = logging.getLogger("nebula")

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
    if settings is not None:
        _first_anchor(url, settings)


def _first_anchor(url: str, settings: Settings) -> None:
    """A new deployment's first audit anchor (seq 0), before any command appends events.

    Without it, events a command writes before the server first starts (the first admin)
    would find no anchor file, which the anchorer takes for a lost one and refuses.
    Run by root for a var folder that belongs to the service user (nebula-migrate.service
    runs as root to read the owner's password), the anchor and its key are written by a
    child process that has become that user: files the API must append to stay the API
    user's, and root never writes into a folder another user controls.
    """
    owner = _service_user_of(settings.var_dir)
    if owner is None:
        _sign_first_anchor(url, settings)
        return
    pid = os.fork()
    if pid == 0:  # the child: the service user from here on, then gone
        code = 1
        try:
            os.setgroups([])
            os.setgid(owner[1])
            os.setuid(owner[0])
            _sign_first_anchor(url, settings)
            code = 0
        except BaseException:
            log.exception("the first audit anchor could not be written as uid %d", owner[0])
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the first audit anchor was not written in {settings.var_dir}")


def _service_user_of(var_dir: Path) -> tuple[int, int] | None:
    """(uid, gid) of the var folder when root runs this for another user's folder, else None."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    try:
        found = var_dir.stat()
    except FileNotFoundError:
        return None
    return None if found.st_uid == 0 else (found.st_uid, found.st_gid)


def _sign_first_anchor(url: str, settings: Settings) -> None:
    from app.audit.service import AnchorsMissing, anchor_head, use_chain_key
    from app.db import make_engine, make_sessionmaker

    engine = use_chain_key(make_engine(url), settings)
    try:
        with make_sessionmaker(engine)() as db:
            anchor_head(db, settings=settings)
    except AnchorsMissing as missing:
        log.error("%s", missing)
    finally:
        engine.dispose()


def downgrade(url: str, revision: str, *, settings: Settings | None = None) -> None:
    """Take the database at `url` back to `revision` (`settings`: as for `upgrade`; 0016
    seals dataset rows again on its way down)."""
    cfg = alembic_config(url)
    if settings is not None:
        cfg.attributes["settings"] = settings
    command.downgrade(cfg, revision)
