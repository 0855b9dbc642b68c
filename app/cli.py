"""The `nebula` command."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Callable, Sequence

from app.settings import Settings, get_settings


def _db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from app.migrate import upgrade

    upgrade(settings.resolved_database_url)
    print(f"database at head: {_redact(settings.resolved_database_url)}")
    return 0


def _redact(url: str) -> str:
    """A database URL without its password, for printing."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _read_password(prompt: str) -> str:
    if sys.stdin.isatty():
        first = getpass.getpass(prompt)
        if getpass.getpass("again: ") != first:
            raise SystemExit("passwords differ")
        return first
    return sys.stdin.readline().rstrip("\n")


def _create_admin(args: argparse.Namespace, settings: Settings) -> int:
    from app.accounts import service as accounts
    from app.accounts.models import Role
    from app.audit.service import SYSTEM
    from app.db import make_engine, make_sessionmaker
    from app.errors import DomainError

    password = _read_password(f"password for {args.email}: ")
    engine = make_engine(settings.resolved_database_url)
    with make_sessionmaker(engine)() as db:
        try:
            user = accounts.create_user(
                db,
                actor=SYSTEM,
                email=args.email,
                display_name=args.name or args.email,
                role=Role.admin,
                password=password,
                settings=settings,
            )
        except DomainError as exc:
            print(f"error: {exc.detail}", file=sys.stderr)
            return 1
        db.commit()
        print(f"admin created: {user.email} ({user.id})")
    engine.dispose()
    return 0


def _audit_verify(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit import service as audit
    from app.db import make_engine, make_sessionmaker

    engine = make_engine(settings.resolved_database_url)
    with make_sessionmaker(engine)() as db:
        result = audit.verify(db)
    engine.dispose()
    if result.ok:
        print(f"audit chain ok: {result.count} events")
        return 0
    print(f"audit chain broken at seq {result.first_bad_seq}")
    return 1


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from app.main import create_app

    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="nebula", description="Nebula control plane")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API and web UI")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(run=_serve)

    users = sub.add_parser("users", help="manage users").add_subparsers(dest="users", required=True)
    create_admin = users.add_parser("create-admin", help="create an admin; password on stdin")
    create_admin.add_argument("email")
    create_admin.add_argument("--name", default=None, help="display name")
    create_admin.set_defaults(run=_create_admin)

    db = sub.add_parser("db", help="database").add_subparsers(dest="db", required=True)
    db.add_parser("upgrade", help="apply migrations up to head").set_defaults(run=_db_upgrade)

    audit = sub.add_parser("audit", help="audit log").add_subparsers(dest="audit", required=True)
    audit.add_parser("verify", help="exit 1 if the hash chain is broken").set_defaults(
        run=_audit_verify
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `nebula` console script."""
    args = build_parser().parse_args(argv)
    settings = get_settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run: Callable[[argparse.Namespace, Settings], int] = args.run
    return run(args, settings)


if __name__ == "__main__":
    sys.exit(main())
