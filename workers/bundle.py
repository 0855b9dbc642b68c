"""A cluster bundle folder on disk (its manifest is contract.bundle.ClusterBundle).

Files are 0600 in a 0700 folder; the switch keeps its key and certificate there too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

from contract.bundle import (
    BROKER_CA_FILE,
    CA_FILE,
    CONTROL_PLANE_CA_FILE,
    MANIFEST,
    ClusterBundle,
)
from workers.switch.tls import write_private_file


def write_bundle(
    bundle: ClusterBundle,
    folder: Path,
    *,
    ca_pem: bytes,
    control_plane_ca_pem: bytes | None,
    broker_ca_pem: bytes | None = None,
) -> None:
    """Write the bundle into `folder` (made with mode 0700)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    write_private_file(folder / MANIFEST, json.dumps(asdict(bundle), indent=2).encode())
    write_private_file(folder / CA_FILE, ca_pem)
    if control_plane_ca_pem is not None:
        write_private_file(folder / CONTROL_PLANE_CA_FILE, control_plane_ca_pem)
    if broker_ca_pem is not None:
        write_private_file(folder / BROKER_CA_FILE, broker_ca_pem)


def load_bundle(folder: Path) -> ClusterBundle:
    """Read a bundle folder; SystemExit with the reason when it is not one."""
    known = {f.name for f in fields(ClusterBundle)}
    try:
        raw = json.loads((folder / MANIFEST).read_text())
        return ClusterBundle(**{k: raw[k] for k in raw if k in known})
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"{folder} is not a cluster bundle: {exc}") from None


def control_plane_ca(folder: Path) -> Path | None:
    """The CA of the control plane's HTTPS certificate, when the bundle has one."""
    path = folder / CONTROL_PLANE_CA_FILE
    return path if path.exists() else None


def broker_ca(folder: Path) -> Path | None:
    """The CA of the broker's TLS certificate (amqps://), when the bundle has one."""
    path = folder / BROKER_CA_FILE
    return path if path.exists() else None
