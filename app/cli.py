"""The `nebula` command."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from app.settings import Settings, get_settings
from workers.settings import ClusterSettings, scrub_control_plane_secrets


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

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    if args.tls_cert:
        settings = settings.model_copy(update={"cookie_secure": True})
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level="info",
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
    )
    return 0


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def _switch(args: argparse.Namespace, settings: ClusterSettings) -> int:
    from workers.switch import agent
    from workers.switch.shaper import ShaperConfig

    peers = {}
    for item in args.peer:
        name, _, address = item.partition("=")
        peers[name] = _address(address)
    shaper = None
    if args.shape_mbit or args.shape_delay_ms:
        shaper = ShaperConfig(rate_mbit=args.shape_mbit, delay_ms=args.shape_delay_ms or 0.0)
    agent.run(
        cluster=args.cluster,
        folder=args.state_dir or settings.var_dir / "clusters" / args.cluster,
        control_plane=args.control_plane or settings.control_plane_url,
        enroll_token=args.enroll_token,
        worker_address=(args.worker_host, args.worker_port),
        peer_address=(args.peer_host, args.peer_port),
        peers=peers,
        shaper=shaper,
        metrics_address=(args.worker_host, args.metrics_port) if args.metrics_port else None,
        crl_grace_s=args.crl_grace_s,
        control_plane_ca=args.control_plane_ca,
    )
    return 0


def _worker(args: argparse.Namespace, settings: ClusterSettings) -> int:
    import json

    from workers.celery_app import make_celery, queue_for
    from workers.control_plane import ClusterClient, ControlPlaneError
    from workers.runner import ClusterSide
    from workers.worker_state import credential_path, set_side, switch_state_path

    if args.switch:
        switch, ca_path = _address(args.switch), args.ca
    else:
        state = json.loads(switch_state_path(settings.var_dir, args.cluster).read_text())
        host, port = state["worker_address"]
        switch, ca_path = (host, int(port)), state["ca_path"]
    credential_file = args.credential_file or credential_path(settings.var_dir, args.cluster)
    try:
        credential = Path(credential_file).read_text().strip()
    except OSError as exc:
        raise SystemExit(f"no worker credential at {credential_file}: {exc}") from None
    control_plane = args.control_plane or settings.control_plane_url
    try:
        client = ClusterClient(control_plane, credential=credential, ca_path=args.control_plane_ca)
        serves = client.whoami()
        client.close()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    except ControlPlaneError as exc:
        raise SystemExit(f"the control plane refused this worker: {exc.detail}") from None
    if serves != args.cluster:
        raise SystemExit(f"the credential belongs to cluster {serves!r}, not {args.cluster!r}")
    set_side(
        ClusterSide(
            cluster=args.cluster,
            switch_address=switch,
            ca_path=Path(ca_path),
            scratch_dir=(
                args.scratch_dir or settings.var_dir / "clusters" / args.cluster / "scratch"
            ).resolve(),
            control_plane=control_plane,
            credential=credential,
            control_plane_ca=args.control_plane_ca,
        )
    )
    app = make_celery(settings.broker_url, settings.var_dir)
    import workers.tasks  # noqa: F401  (registers the task)

    app.worker_main(
        [
            "worker",
            "--queues",
            queue_for(args.cluster),
            "--concurrency",
            str(args.concurrency),
            "--hostname",
            f"{args.cluster}@%h",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )
    return 0


def _worker_credential(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit.service import SYSTEM
    from app.clusters import service as clusters
    from app.db import make_engine, make_sessionmaker
    from workers.switch.tls import write_private_file

    engine = make_engine(settings.resolved_database_url)
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


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from app.up import up

    return up(settings, host=args.host, port=args.port)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from app.demo import run_demo
    from app.up import demo_admin_path

    login_file = demo_admin_path(settings)
    if not login_file.exists():
        print(f"no demo login at {login_file}: start the platform with `nebula up` first")
        return 1
    login = json.loads(login_file.read_text())
    return run_demo(
        args.url.rstrip("/"),
        login["email"],
        login["password"],
        electra_steps=args.electra_steps,
        abnet_steps=args.abnet_steps,
    )


def _demo_corpus(args: argparse.Namespace, settings: Settings) -> int:
    from workers.training.data import write_demo_corpus

    for name, path in write_demo_corpus(Path(args.directory)).items():
        print(f"{name}: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="nebula", description="Nebula control plane")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API and web UI")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    serve.set_defaults(run=_serve)

    users = sub.add_parser("users", help="manage users").add_subparsers(dest="users", required=True)
    create_admin = users.add_parser("create-admin", help="create an admin; password on stdin")
    create_admin.add_argument("email")
    create_admin.add_argument("--name", default=None, help="display name")
    create_admin.set_defaults(run=_create_admin)

    up = sub.add_parser("up", help="everything on one machine: API, UI, two clusters")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.set_defaults(run=_up)

    demo = sub.add_parser("demo", help="walk users, data, grants and two jobs through the API")
    demo.add_argument("--url", default="http://127.0.0.1:8000")
    demo.add_argument("--electra-steps", type=int, default=150)
    demo.add_argument("--abnet-steps", type=int, default=300)
    demo.set_defaults(run=_demo)

    switch = sub.add_parser("switch", help="run a cluster's switch (enrolls on first start)")
    switch.add_argument("--cluster", required=True)
    switch.add_argument("--control-plane", default=None, help="its URL (https unless on loopback)")
    switch.add_argument("--control-plane-ca", type=Path, default=None, help="CA of its HTTPS")
    switch.add_argument(
        "--crl-grace-s", type=float, default=300.0, help="serve this long without a fresh CRL"
    )
    switch.add_argument("--enroll-token", default=None)
    switch.add_argument("--state-dir", type=Path, default=None)
    switch.add_argument("--worker-host", default="127.0.0.1")
    switch.add_argument("--worker-port", type=int, default=7201)
    switch.add_argument("--peer-host", default="127.0.0.1")
    switch.add_argument("--peer-port", type=int, default=7101)
    switch.add_argument("--peer", action="append", default=[], help="NAME=HOST:PORT of a peer")
    switch.add_argument("--metrics-port", type=int, default=0)
    switch.add_argument("--shape-mbit", type=float, default=None, help="link rate to peers")
    switch.add_argument("--shape-delay-ms", type=float, default=None, help="added delay to peers")
    switch.set_defaults(run=_switch, cluster_side=True)

    worker = sub.add_parser("worker", help="a Celery worker on a cluster's queue")
    worker.add_argument("--cluster", required=True)
    worker.add_argument("--switch", default=None, help="HOST:PORT of the switch (else its state)")
    worker.add_argument("--ca", default=None, help="the platform CA (with --switch)")
    worker.add_argument("--concurrency", type=int, default=2)
    worker.add_argument("--control-plane", default=None, help="its URL (https unless on loopback)")
    worker.add_argument("--control-plane-ca", type=Path, default=None, help="CA of its HTTPS")
    worker.add_argument(
        "--credential-file",
        type=Path,
        default=None,
        help="the cluster's worker credential (default var/clusters/NAME/worker-credential)",
    )
    worker.add_argument("--scratch-dir", type=Path, default=None, help="cluster-local disk")
    worker.set_defaults(run=_worker, cluster_side=True)

    clusters = sub.add_parser("clusters", help="clusters (on the control plane)").add_subparsers(
        dest="clusters", required=True
    )
    credential = clusters.add_parser(
        "worker-credential", help="issue a worker credential for a cluster (shown once)"
    )
    credential.add_argument("name", help="the cluster's name")
    credential.add_argument("--out", type=Path, default=None, help="write it here, mode 0600")
    credential.set_defaults(run=_worker_credential)

    data = sub.add_parser("data", help="data tools").add_subparsers(dest="data", required=True)
    corpus = data.add_parser("demo-corpus", help="write the es-en demo corpus")
    corpus.add_argument("directory")
    corpus.set_defaults(run=_demo_corpus)

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
    settings: Settings | ClusterSettings
    if getattr(args, "cluster_side", False):
        # a cluster process never sees the control plane's database or secret
        scrub_control_plane_secrets()
        settings = ClusterSettings()
    else:
        settings = get_settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # third-party chatter that says nothing a user needs at INFO
    for noisy in ("alembic", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run: Callable[[argparse.Namespace, Settings | ClusterSettings], int] = args.run
    return run(args, settings)


if __name__ == "__main__":
    sys.exit(main())
