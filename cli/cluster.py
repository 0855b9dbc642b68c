"""A cluster host's commands: its switch and its workers.

They run beside no control plane: they refuse to start with its database URL or secret
in their environment (cli.main), read ClusterSettings, and get the rest from a bundle
folder, their flags or what the switch left under var_dir (workers.bundle.plan_worker).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workers import bundle as bundles
from workers.settings import ClusterSettings


def _switch(args: argparse.Namespace, settings: ClusterSettings) -> int:
    from workers import switch_agent as agent
    from workers.switch.shaper import ShaperConfig

    peers = {}
    for item in args.peer:
        name, _, address = item.partition("=")
        peers[name] = bundles.host_port(address)
    shaper = None
    if args.shape_mbit or args.shape_delay_ms:
        shaper = ShaperConfig(rate_mbit=args.shape_mbit, delay_ms=args.shape_delay_ms or 0.0)
    flags = bundles.SwitchFlags(
        cluster=args.cluster,
        bundle=args.bundle,
        control_plane=args.control_plane,
        control_plane_ca=args.control_plane_ca,
        enroll_token=args.enroll_token,
        state_dir=args.state_dir,
        credential_file=args.credential_file,
    )
    try:
        plan = bundles.plan_switch(
            flags,
            bundle=bundles.read_bundle_folder(args.bundle) if args.bundle else None,
            var_dir=settings.var_dir,
            control_plane_url=settings.control_plane_url,
        )
    except bundles.ClusterSetupError as exc:
        raise SystemExit(str(exc)) from None
    credential = plan.credential_file.read_text().strip() if plan.credential_file else None
    agent.run(
        cluster=plan.cluster,
        folder=plan.folder,
        control_plane=plan.control_plane,
        enroll_token=plan.enroll_token,
        worker_address=(args.worker_host, args.worker_port),
        peer_address=(args.peer_host, args.peer_port),
        peers=peers,
        shaper=shaper,
        metrics_address=(args.worker_host, args.metrics_port) if args.metrics_port else None,
        crl_grace_s=args.crl_grace_s if args.crl_grace_s is not None else settings.crl_grace_s,
        control_plane_ca=plan.control_plane_ca,
        credential=credential or plan.credential,
        max_connections=settings.switch_max_connections,
        max_connections_per_source=settings.switch_max_connections_per_source,
        auth_timeout_s=settings.switch_auth_timeout_s,
    )
    return 0


def _worker(args: argparse.Namespace, settings: ClusterSettings) -> int:
    import json

    from common.broker import make_celery
    from contract.queues import queue_for
    from workers.control_plane import ClusterClient, ControlPlaneError
    from workers.presence import PresenceReporter
    from workers.runner import ClusterSide, describe_device, resolve_device
    from workers.worker_state import current_side, set_side

    flags = bundles.WorkerFlags(
        cluster=args.cluster,
        bundle=args.bundle,
        switch=args.switch,
        ca=args.ca,
        control_plane=args.control_plane,
        control_plane_ca=args.control_plane_ca,
        credential_file=args.credential_file,
        scratch_dir=args.scratch_dir,
    )
    try:
        plan = bundles.plan_worker(
            flags,
            bundle=bundles.read_bundle_folder(args.bundle) if args.bundle else None,
            var_dir=settings.var_dir,
            broker_url=settings.broker_url,
            control_plane_url=settings.control_plane_url,
        )
    except bundles.ClusterSetupError as exc:
        raise SystemExit(str(exc)) from None
    cluster, control_plane, control_plane_ca = (
        plan.cluster,
        plan.control_plane,
        plan.control_plane_ca,
    )
    switch, ca_path = plan.switch, plan.ca_path
    if plan.switch_state is not None:
        state = json.loads(plan.switch_state.read_text())
        host, port = state["worker_address"]
        switch, ca_path = (host, int(port)), state["ca_path"]
    assert switch is not None and ca_path is not None  # given, or read from the state
    credential = plan.credential
    if plan.credential_file is not None:
        try:
            credential = Path(plan.credential_file).read_text().strip()
        except OSError as exc:
            raise SystemExit(f"no worker credential at {plan.credential_file}: {exc}") from None
    try:
        client = ClusterClient(control_plane, credential=credential, ca_path=control_plane_ca)
        serves = client.whoami()
        client.close()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    except ControlPlaneError as exc:
        raise SystemExit(f"the control plane refused this worker: {exc.detail}") from None
    if serves != cluster:
        raise SystemExit(f"the credential belongs to cluster {serves!r}, not {cluster!r}")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    set_side(
        ClusterSide(
            cluster=cluster,
            device=device,
            switch_address=switch,
            ca_path=Path(ca_path),
            scratch_dir=plan.scratch_dir.resolve(),
            control_plane=control_plane,
            credential=credential,
            control_plane_ca=control_plane_ca,
            rendezvous_host=args.rendezvous_host,
        )
    )
    app = make_celery(plan.broker_url, settings.var_dir, broker_ca=plan.broker_ca)
    import workers.tasks  # noqa: F401  (registers the task)

    reporter = PresenceReporter(
        ClusterClient(control_plane, credential=credential, ca_path=control_plane_ca),
        kind="worker",
        cluster=cluster,
        scratch_dir=current_side().scratch_dir,
        device=describe_device(device),
    ).start()
    try:
        app.worker_main(
            [
                "worker",
                "--queues",
                queue_for(cluster),
                "--concurrency",
                str(args.concurrency),
                "--hostname",
                f"{cluster}@%h",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
    finally:
        reporter.stop()
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """A cluster host's subcommands; each refuses to start beside the control plane's secrets."""
    switch = sub.add_parser("switch", help="run a cluster's switch (enrolls on first start)")
    switch.add_argument("--cluster", default=None)
    switch.add_argument("--bundle", type=Path, default=None, help="a cluster bundle folder")
    switch.add_argument("--control-plane", default=None, help="its URL (https unless on loopback)")
    switch.add_argument("--control-plane-ca", type=Path, default=None, help="CA of its HTTPS")
    switch.add_argument(
        "--crl-grace-s",
        type=float,
        default=None,
        help="serve this long without a fresh CRL (default NEBULA_CRL_GRACE_S, 300)",
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
    switch.add_argument(
        "--credential-file", type=Path, default=None, help="worker credential, to report in"
    )
    switch.set_defaults(run=_switch, cluster_side=True)

    worker = sub.add_parser("worker", help="a Celery worker on a cluster's queue")
    worker.add_argument("--cluster", default=None)
    worker.add_argument("--bundle", type=Path, default=None, help="a cluster bundle folder")
    worker.add_argument("--switch", default=None, help="HOST:PORT of the switch (else its state)")
    worker.add_argument("--ca", default=None, help="the platform CA (with --switch)")
    worker.add_argument("--concurrency", type=int, default=2)
    worker.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="auto",
        help="where roles train: cpu, cuda (refused without one), auto (CUDA when present)",
    )
    worker.add_argument("--control-plane", default=None, help="its URL (https unless on loopback)")
    worker.add_argument("--control-plane-ca", type=Path, default=None, help="CA of its HTTPS")
    worker.add_argument(
        "--credential-file",
        type=Path,
        default=None,
        help="the cluster's worker credential (default var/clusters/NAME/worker-credential)",
    )
    worker.add_argument(
        "--scratch-dir", type=Path, default=None, help="cluster disk, shared by its workers"
    )
    worker.add_argument(
        "--rendezvous-host",
        default="127.0.0.1",
        help="this host's address for the cluster's other workers (discriminator replicas)",
    )
    worker.set_defaults(run=_worker, cluster_side=True)
