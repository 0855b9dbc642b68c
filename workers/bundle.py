"""A cluster bundle: everything a cluster host needs, written once on the control plane.

`nebula clusters bundle NAME --out DIR` writes the folder; `nebula switch --bundle DIR`
and `nebula worker --bundle DIR` read it. It holds the cluster's name, the control
plane's URL (and the CA of its HTTPS certificate), the platform CA certificate, a
single-use enrollment token for the switch, the worker credential and the broker URL
with the cluster's own broker user. Nothing in it opens the database or any data.
Files are 0600 in a 0700 folder; the switch keeps its key and certificate there too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workers.switch.tls import write_private_file

MANIFEST = "bundle.json"
CA_FILE = "ca.pem"
CONTROL_PLANE_CA_FILE = "control-plane-ca.pem"


@dataclass(frozen=True)
class ClusterBundle:
    """The contents of a bundle folder."""

    cluster: str
    control_plane_url: str
    worker_credential: str = field(repr=False)
    enrollment_token: str | None = field(default=None, repr=False)
    broker_url: str = field(default="", repr=False)  # empty: the embedded broker

    def write(self, folder: Path, *, ca_pem: bytes, control_plane_ca_pem: bytes | None) -> None:
        """Write the bundle into `folder` (made with mode 0700)."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
        write_private_file(folder / MANIFEST, json.dumps(asdict(self), indent=2).encode())
        write_private_file(folder / CA_FILE, ca_pem)
        if control_plane_ca_pem is not None:
            write_private_file(folder / CONTROL_PLANE_CA_FILE, control_plane_ca_pem)

    @classmethod
    def load(cls, folder: Path) -> ClusterBundle:
        """Read a bundle folder; SystemExit with the reason when it is not one."""
        try:
            raw = json.loads((folder / MANIFEST).read_text())
            return cls(**{k: raw[k] for k in raw if k in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError) as exc:
            raise SystemExit(f"{folder} is not a cluster bundle: {exc}") from None

    @staticmethod
    def control_plane_ca(folder: Path) -> Path | None:
        """The CA of the control plane's HTTPS certificate, when the bundle has one."""
        path = folder / CONTROL_PLANE_CA_FILE
        return path if path.exists() else None
