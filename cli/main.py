"""The `nebula` command: one entry point for both sides' subcommands.

The control plane's commands are in cli/control_plane.py, a cluster host's (switch,
worker) in cli/cluster.py; this file builds the parser from both, picks the settings
of the side a command runs on, and sets up logging.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from app.settings import Settings, get_settings
from cli import cluster, control_plane
from workers.settings import (
    ClusterSettings,
    control_plane_secrets_set,
    scrub_control_plane_secrets,
)

# what the shipped systemd units put on the command line from the env file
UNIT_ARGUMENTS = {"NEBULA_PEERS", "NEBULA_SWITCH"}


def unknown_settings(environ: dict[str, str] | None = None) -> list[str]:
    """NEBULA_ variables in the environment that no setting reads, each with a near name."""
    import difflib
    import os

    environ = dict(os.environ) if environ is None else environ
    known = {
        f"NEBULA_{name.upper()}"
        for model in (Settings, ClusterSettings)
        for name in model.model_fields
    } | UNIT_ARGUMENTS
    warnings = []
    for name in sorted(environ):
        # NEBULA_TEST_*: the test suite's own
        if not name.startswith("NEBULA_") or name in known or name.startswith("NEBULA_TEST_"):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        warnings.append(f"unknown setting {name} is ignored{hint}")
    return warnings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="nebula",
        description="Nebula: the control plane, a cluster's switch and workers, "
        "the whole platform on one machine and its demo",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    control_plane.add_commands(sub)
    cluster.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `nebula` console script."""
    args = build_parser().parse_args(argv)
    settings: Settings | ClusterSettings
    if getattr(args, "cluster_side", False):
        # a cluster process never sees the control plane's database or secret: once they
        # are in its environment, /proc/PID/environ shows them whatever it deletes
        found = control_plane_secrets_set()
        if found:
            print(
                f"error: nebula {args.command} refuses to start with {' and '.join(found)} set:"
                " a cluster process must never hold the control plane's secrets. Start it"
                " without them (`env -u NAME ...`).",
                file=sys.stderr,
            )
            return 2
        scrub_control_plane_secrets()
        settings = ClusterSettings()
    else:
        settings = get_settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for warning in unknown_settings():  # a typo in an env file would silently do nothing
        logging.getLogger("nebula").warning("%s", warning)
    # third-party chatter that says nothing a user needs at INFO
    for noisy in ("alembic", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run: Callable[[argparse.Namespace, Settings | ClusterSettings], int] = args.run
    return run(args, settings)


if __name__ == "__main__":
    sys.exit(main())
