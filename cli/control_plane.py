"""The control plane's commands: its server, users, clusters' bundles and credentials,
the database, the audit log, the platform on one machine and its demo.

Each command owns its unit of work: it opens a session on the platform's database,
calls the services and commits.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.settings import Settings
from workers import bundle as bundles

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

    from app.clusters.models import Cluster


def _db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from app.migrate import upgrade

    upgrade(settings.resolved_database_url, settings=settings)
    print(f"database at head: {_redact(settings.resolved_database_url)}")
    return 0


def _db_grants(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit.privileges import app_role_grants
    from app.errors import DomainError

    try:
        statements = app_role_grants(args.role)
    except DomainError as exc:
        print(f"error: {exc.detail}", file=sys.stderr)
        return 1
    for statement in statements:
        print(statement + ";")
    return 0


def _engine(settings: Settings) -> Engine:
    """An engine on the platform's database whose sessions can append to the audit chain."""
    from app.audit.service import use_chain_key
    from app.db import make_engine

    return use_chain_key(make_engine(settings.resolved_database_url), settings)


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
    from app.db import make_sessionmaker
    from app.errors import DomainError

    password = _read_password(f"password for {args.email}: ")
    engine = _engine(settings)
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


def _reset_link(args: argparse.Namespace, settings: Settings) -> int:
    from app.accounts import recovery
    from app.accounts import service as accounts
    from app.audit.service import SYSTEM
    from app.db import make_sessionmaker
    from app.errors import DomainError

    engine = _engine(settings)
    try:
        with make_sessionmaker(engine)() as db:
            try:
                user = accounts.get_user_by_email(db, email=args.email)
                issued = recovery.issue_link(db, actor=SYSTEM, user=user, settings=settings)
            except DomainError as exc:
                print(f"error: {exc.detail}", file=sys.stderr)
                return 1
            db.commit()
            # the link goes to standard output alone, so that it can be piped; it is not kept
            print(issued.url)
            print(
                f"one-time reset link for {user.email}, valid until "
                f"{issued.record.expires_at:%Y-%m-%d %H:%M} UTC",
                file=sys.stderr,
            )
    finally:
        engine.dispose()
    return 0


def _audit_verify(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit import service as audit
    from app.audit.anchor import AnchorKeyError
    from app.audit.mirrors import MirrorSettingError
    from app.db import make_sessionmaker

    engine = _engine(settings)
    try:
        with make_sessionmaker(engine)() as db:
            result = audit.verify(db, settings=settings)
    except (AnchorKeyError, MirrorSettingError) as exc:
        print(f"audit chain not checked: {exc}")
        return 1
    finally:
        engine.dispose()
    if result.ok:
        print(f"audit chain ok: {result.count} events, signed head at seq {result.anchored_seq}")
        return 0
    print(f"audit chain broken at seq {result.first_bad_seq} ({result.count} events checked)")
    for problem in result.problems:
        print(f"  {problem.detail}")
    return 1


def _audit_adopt(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit import service as audit
    from app.audit.anchor import AnchorLog
    from app.db import make_sessionmaker

    if AnchorLog.for_settings(settings).newest() is not None:
        print("the anchor file holds anchors already; nothing adopted", file=sys.stderr)
        return 1
    engine = _engine(settings)
    with make_sessionmaker(engine)() as db:
        anchor = audit.anchor_head(db, settings=settings, adopt=True)
    engine.dispose()
    assert anchor is not None
    print(
        f"first anchor signed at seq {anchor.seq}; events 1..{anchor.legacy_through}"
        " kept as an unkeyed chain, pinned by it"
    )
    return 0


def _audit_mirror_serve(args: argparse.Namespace, settings: Settings) -> int:
    import base64
    import signal
    import ssl
    import threading

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from app.audit.mirrors import MirrorServer
    from common.urls import is_loopback

    try:
        token = args.token_file.read_text().strip()
        keys = [Ed25519PublicKey.from_public_bytes(base64.b64decode(k)) for k in args.public_key]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if len(token) < 32:
        print("error: the writer token must be at least 32 characters", file=sys.stderr)
        return 2
    tls = None
    if args.cert is not None and args.key is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(args.cert, args.key)
    elif args.cert is not None or args.key is not None:
        print("error: --cert and --key go together", file=sys.stderr)
        return 2
    elif not is_loopback(args.host):
        print(
            f"error: serving on {args.host} without TLS would let the writer token cross in"
            " clear: give --cert and --key",
            file=sys.stderr,
        )
        return 2
    args.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    server = MirrorServer(
        (args.host, args.port), folder=args.dir, token=token, public_keys=keys, tls=tls
    )
    stopping = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    scheme = "https" if tls is not None else "http"
    print(
        f"anchor mirror on {scheme}://{args.host}:{server.server_address[1]} keeping {args.dir}"
        f" ({len(server.store.seqs())} anchors; writes need the token"
        f"{', and a signature by a listed key' if keys else ''})",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _anchor_key(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit.anchor import (
        AnchorKeyError,
        anchor_key_path,
        anchor_signing_key,
        create_anchor_key,
        derived_anchor_key,
        public_key_b64,
    )

    if args.action == "create":
        path = args.out or anchor_key_path(settings)
        try:
            public = create_anchor_key(path)
        except FileExistsError:
            print(f"{path} exists; a key is never replaced (rotate to a new file)", file=sys.stderr)
            return 1
        print(f"anchor signing key written to {path} (mode 0600)")
        print(f"public key: {public_key_b64(public)}")
        return 0
    if args.action == "derived-public":
        # the key releases before the key file derived from the platform secret: list it in
        # NEBULA_AUDIT_ANCHOR_PUBLIC_KEYS while moving to a key file (docs/audit.md)
        print(public_key_b64(derived_anchor_key(settings).public_key()))
        return 0
    try:
        print(public_key_b64(anchor_signing_key(settings).public_key()))
    except AnchorKeyError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from app.serving import serve

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    return serve(
        settings,
        host=args.host,
        port=args.port,
        workers=args.workers,
        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
    )


def _worker_credential(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit.service import SYSTEM
    from app.clusters import service as clusters
    from app.db import make_sessionmaker
    from common.private_files import write_private_file

    engine = _engine(settings)
    with make_sessionmaker(engine)() as db:
        cluster = clusters.by_name(db, name=args.name)
        if cluster is None:
            print(f"error: no cluster named {args.name!r}", file=sys.stderr)
            return 1
        row, secret = clusters.create_worker_credential(db, actor=SYSTEM, cluster=cluster)
        db.commit()
    engine.dispose()
    if args.out:
        write_private_file(args.out, (secret + "\n").encode())
        print(f"worker credential {row.id} of {args.name} written to {args.out}")
    else:
        print(secret)
    return 0


def _cluster_named(db: Session, name: str) -> Cluster:
    from app.clusters import service as clusters

    cluster = clusters.by_name(db, name=name)
    if cluster is None:
        raise SystemExit(f"no cluster named {name!r}")
    return cluster


def _broker_credentials(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit.service import SYSTEM
    from app.clusters import broker
    from app.clusters.bundle import BrokerChoice, broker_url_for
    from app.db import make_sessionmaker
    from common.private_files import write_private_file

    if not broker.is_rabbitmq(settings.broker_url):
        raise SystemExit("per-cluster broker users need RabbitMQ (NEBULA_BROKER_URL=amqp://...)")
    engine = _engine(settings)
    with make_sessionmaker(engine)() as db:
        cluster = _cluster_named(db, args.name)
        choice = BrokerChoice(allow_plain=getattr(args, "insecure_plain_broker", False))
        try:
            url = broker_url_for(
                db, settings, actor=SYSTEM, cluster=cluster, allow_plain=choice.allow_plain
            )
        except broker.BrokerError as exc:
            db.commit()  # the cluster's broker state and its audit event
            print(f"error: {exc}", file=sys.stderr)
            return 1
        db.commit()
    engine.dispose()
    if args.print_url is False:
        print(f"broker user of {args.name}: ok")
    elif args.out:
        write_private_file(args.out, (url + "\n").encode())
        print(f"broker URL of {args.name} written to {args.out}")
    else:
        print(url)
    return 0


def _bundle(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import timedelta

    from app.audit.service import SYSTEM
    from app.clusters import broker
    from app.clusters.bundle import (
        BrokerChoice,
        PlainBrokerRefused,
        SharedBrokerRefused,
        make_bundle,
        rotate_broker_password,
    )
    from app.db import make_sessionmaker

    control_plane = args.control_plane or settings.public_url
    control_plane_ca = args.control_plane_ca.read_bytes() if args.control_plane_ca else None
    if args.out.exists() or args.out.is_symlink():
        raise SystemExit(f"{args.out} already exists: name a new folder for the bundle")
    broker_ca = args.broker_ca.read_bytes() if args.broker_ca else None
    engine = _engine(settings)
    hosts: list[str] | None = None
    with make_sessionmaker(engine)() as db:
        cluster = _cluster_named(db, args.name)
        if args.rotate_broker_password:
            if not broker.is_rabbitmq(settings.broker_url):
                raise SystemExit("--rotate-broker-password needs RabbitMQ: no per-cluster users")
            hosts = rotate_broker_password(db, actor=SYSTEM, cluster=cluster)
        choice = BrokerChoice(
            reached_at=args.broker_url or "",
            allow_shared=args.insecure_shared_broker,
            allow_plain=args.insecure_plain_broker,
        )
        try:
            bundle, ca_pem = make_bundle(
                db,
                actor=SYSTEM,
                cluster=cluster,
                settings=settings,
                control_plane_url=control_plane,
                enroll_ttl=timedelta(minutes=args.enroll_ttl_minutes),
                broker_choice=choice,
            )
        except (PlainBrokerRefused, SharedBrokerRefused) as exc:
            print(f"error: {exc}", file=sys.stderr)  # nothing changed, a rotation included
            return 1
        except broker.BrokerError as exc:
            # kept: the cluster's broker state, its audit event and a rotation (the root
            # command in the message sets the rotated password)
            db.commit()
            print(f"error: {exc}", file=sys.stderr)
            _print_hosts(args.name, hosts)
            return 1
        try:
            bundles.write_bundle(
                bundle,
                args.out,
                ca_pem=ca_pem,
                control_plane_ca_pem=control_plane_ca,
                broker_ca_pem=broker_ca,
            )
        except FileExistsError:
            raise SystemExit(
                f"{args.out} already exists: name a new folder for the bundle"
            ) from None
        db.commit()
    engine.dispose()
    print(f"bundle of {args.name} written to {args.out}: copy it to the cluster host, then")
    print("  nebula switch --bundle DIR --peer ... ; nebula worker --bundle DIR")
    _print_hosts(args.name, hosts)
    return 0


def _print_hosts(cluster: str, hosts: list[str] | None) -> None:
    """After a rotation: the hosts that must get the new bundle."""
    if hosts is None:
        return
    print(
        f"the broker password of {cluster} changed: update every host of the cluster with "
        "the new bundle before it restarts (it fails to log in to the broker until then):"
    )
    for host in hosts or ["(no host of this cluster has reported in yet)"]:
        print(f"  {host}")


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from cli.up import up

    return up(settings, host=args.host, port=args.port)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from cli.demo import run_demo
    from cli.up import demo_admin_path

    login_file = args.login_file or demo_admin_path(settings)
    try:
        login = json.loads(login_file.read_text())
        email, password = login["email"], login["password"]
    except FileNotFoundError:
        print(
            f"no demo login at {login_file}: start the platform with `nebula up` first, or "
            'give --login-file with {"email": ..., "password": ...} of an admin',
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f'{login_file} is not a login file ({{"email", "password"}}): {exc}', file=sys.stderr)
        return 1
    if args.ca is not None and not args.ca.is_file():
        print(f"no CA file at {args.ca}", file=sys.stderr)
        return 1
    return run_demo(
        args.url.rstrip("/"),
        email,
        password,
        electra_steps=args.electra_steps,
        abnet_steps=args.abnet_steps,
        ca=args.ca,
        cleanup=args.cleanup,
        as_json=args.json,
    )


def _doctor(args: argparse.Namespace, settings: Settings) -> int:
    from cli.doctor import report, run_checks

    return report(run_checks(settings, tls_cert=args.tls_cert, warn_days=args.warn_days))


def _demo_corpus(args: argparse.Namespace, settings: Settings) -> int:
    from workers.training.data import write_demo_corpus

    for name, path in write_demo_corpus(Path(args.directory)).items():
        print(f"{name}: {path}")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The control plane's subcommands."""
    serve = sub.add_parser("serve", help="run the API and web UI")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--workers", type=int, default=1, help="server processes (the reaper runs once)"
    )
    serve.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    serve.set_defaults(run=_serve)

    users = sub.add_parser("users", help="manage users").add_subparsers(dest="users", required=True)
    create_admin = users.add_parser("create-admin", help="create an admin; password on stdin")
    create_admin.add_argument("email")
    create_admin.add_argument("--name", default=None, help="display name")
    create_admin.set_defaults(run=_create_admin)
    reset_link = users.add_parser(
        "reset-link", help="print a one-time password reset link (30 minutes, shown once)"
    )
    reset_link.add_argument("email")
    reset_link.set_defaults(run=_reset_link)

    up = sub.add_parser("up", help="everything on one machine: API, UI, two clusters")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.set_defaults(run=_up)

    demo = sub.add_parser("demo", help="walk users, data, grants and two jobs through the API")
    demo.add_argument("--url", default="http://127.0.0.1:8000")
    demo.add_argument("--electra-steps", type=int, default=150)
    demo.add_argument("--abnet-steps", type=int, default=300)
    demo.add_argument("--ca", type=Path, default=None, help="CA of the API's HTTPS certificate")
    demo.add_argument(
        "--login-file",
        type=Path,
        default=None,
        help='an admin\'s {"email": ..., "password": ...} (default: what `nebula up` wrote)',
    )
    demo.add_argument(
        "--cleanup", action="store_true", help="delete the demo's users and their data at the end"
    )
    demo.add_argument("--json", action="store_true", help="end with the raw figures as JSON too")
    demo.set_defaults(run=_demo)

    clusters = sub.add_parser("clusters", help="clusters (on the control plane)").add_subparsers(
        dest="clusters", required=True
    )
    credential = clusters.add_parser(
        "worker-credential", help="issue a worker credential for a cluster (shown once)"
    )
    credential.add_argument("name", help="the cluster's name")
    credential.add_argument("--out", type=Path, default=None, help="write it here, mode 0600")
    credential.set_defaults(run=_worker_credential)
    broker_credentials = clusters.add_parser(
        "broker-credentials",
        help="(re)make a cluster's RabbitMQ user, allowed its own queue only; prints its URL",
    )
    broker_credentials.add_argument("name", help="the cluster's name")
    broker_credentials.add_argument("--out", type=Path, default=None, help="write it, 0600")
    broker_credentials.add_argument(
        "--insecure-plain-broker",
        action="store_true",
        help="allow an amqp:// (no TLS) cluster broker URL off loopback",
    )
    broker_credentials.set_defaults(run=_broker_credentials, print_url=True)
    broker_user = clusters.add_parser(
        "broker-user",
        help="make sure a cluster's RabbitMQ user exists (else print the one root command)",
    )
    broker_user.add_argument("name", help="the cluster's name")
    broker_user.set_defaults(
        run=_broker_credentials, print_url=False, out=None, insecure_plain_broker=True
    )
    bundle = clusters.add_parser(
        "bundle", help="write what a cluster host needs into a folder (nebula ... --bundle DIR)"
    )
    bundle.add_argument("name", help="the cluster's name")
    bundle.add_argument("--out", type=Path, required=True, help="the folder to write")
    bundle.add_argument("--control-plane", default=None, help="URL clusters reach the API by")
    bundle.add_argument(
        "--control-plane-ca", type=Path, default=None, help="CA of the API's HTTPS certificate"
    )
    bundle.add_argument(
        "--broker-url", default=None, help="the broker as this cluster reaches it (no password)"
    )
    bundle.add_argument(
        "--broker-ca", type=Path, default=None, help="CA of the broker's TLS (amqps://)"
    )
    bundle.add_argument(
        "--rotate-broker-password",
        action="store_true",
        help="give the cluster a new broker password (every host then needs the new bundle)",
    )
    bundle.add_argument(
        "--insecure-shared-broker",
        action="store_true",
        help="allow a remote cluster the control plane's own broker URL (Redis, embedded)",
    )
    bundle.add_argument(
        "--insecure-plain-broker",
        action="store_true",
        help="allow an amqp:// (no TLS) cluster broker URL off loopback",
    )
    bundle.add_argument("--enroll-ttl-minutes", type=int, default=24 * 60)
    bundle.set_defaults(run=_bundle)

    data = sub.add_parser("data", help="data tools").add_subparsers(dest="data", required=True)
    corpus = data.add_parser("demo-corpus", help="write the es-en demo corpus")
    corpus.add_argument("directory")
    corpus.set_defaults(run=_demo_corpus)

    db = sub.add_parser("db", help="database").add_subparsers(dest="db", required=True)
    db.add_parser("upgrade", help="apply migrations up to head").set_defaults(run=_db_upgrade)
    grants = db.add_parser("grants", help="print the SQL that limits the app's PostgreSQL role")
    grants.add_argument("role", help="the role the control plane connects as")
    grants.set_defaults(run=_db_grants)

    doctor = sub.add_parser(
        "doctor", help="check the database, broker, secret, anchors, CA and certificates"
    )
    doctor.add_argument(
        "--tls-cert", type=Path, default=None, help="the API's HTTPS certificate, to check too"
    )
    doctor.add_argument(
        "--warn-days", type=int, default=14, help="warn of certificates expiring this soon"
    )
    doctor.set_defaults(run=_doctor)

    audit = sub.add_parser("audit", help="audit log").add_subparsers(dest="audit", required=True)
    audit.add_parser("verify", help="exit 1 if the chain or its anchor is broken").set_defaults(
        run=_audit_verify
    )
    audit.add_parser(
        "adopt",
        help="sign the chain as it stands as the first anchor (an upgrade from a release"
        " without the keyed chain); refused once an anchor file exists",
    ).set_defaults(run=_audit_adopt)
    anchor_key = audit.add_parser(
        "anchor-key",
        help="the key that signs the audit anchors: create one (0600, never overwritten),"
        " print its public key, or the public key earlier releases derived",
    )
    anchor_key.add_argument("action", choices=["create", "public", "derived-public"])
    anchor_key.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where create writes the key (default: NEBULA_AUDIT_ANCHOR_KEY_FILE or"
        " var/audit_anchor_key)",
    )
    anchor_key.set_defaults(run=_anchor_key)
    mirror = audit.add_parser(
        "mirror-serve",
        help="on a second host: keep a write-once copy of a control plane's anchors (its"
        " NEBULA_AUDIT_ANCHOR_MIRROR); an anchor is never replaced (409)",
    )
    mirror.add_argument("--dir", type=Path, required=True, help="where the anchors are kept")
    mirror.add_argument(
        "--token-file",
        type=Path,
        required=True,
        help="the file holding the writer's token (the control plane's"
        " NEBULA_AUDIT_ANCHOR_MIRROR_TOKEN_FILE holds the same)",
    )
    mirror.add_argument("--host", default="127.0.0.1")
    mirror.add_argument("--port", type=int, default=8470)
    mirror.add_argument("--cert", type=Path, default=None, help="TLS certificate (PEM)")
    mirror.add_argument("--key", type=Path, default=None, help="its private key (PEM)")
    mirror.add_argument(
        "--public-key",
        action="append",
        default=[],
        help="accept only anchors signed by this key (base64, `nebula audit anchor-key"
        " public`); repeat for retired keys",
    )
    mirror.set_defaults(run=_audit_mirror_serve)
